"""A real distributed runtime across two nodes: JAX on CPU (gloo collectives) in a two-member
training group, reading only the platform's MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK.

Two agents on this one machine stand for two hosts. On the docker runtime each member is a
Debian python container with the cached JAX mounted read-only; on the process runtime each is
a host process at the seeds' default `memory_mb` (2048), two such groups at once.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from .cluster import Cluster
from .conftest import requires_docker
from .workloads import (
    JAX_DIR,
    PYTHON,
    PYTHON_IMAGE,
    allgather_command,
    python_image_missing,
    requires_jax,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, requires_jax]

# The cached JAX may be mounted into a container (read-only), nothing else of the host.
ALLOW = {"HETEROFLOW_VOLUME_ALLOW_LIST": json.dumps([str(JAX_DIR)])}
GATHERED = re.compile(r"^allgather \[1\.0, 2\.0\] rank (\d)$")


def create_group(cluster: Cluster, **body: Any) -> dict[str, Any]:
    body = {"task_type": "training", "task_count": 2, "cpu_cores": 0.5} | body
    return cluster.create_group(**body)


def settled(cluster: Cluster, group_id: str) -> bool:
    return cluster.group(group_id)["status"] in ("completed", "failed", "stopped")


def assert_gathered(cluster: Cluster, group_id: str) -> list[dict[str, Any]]:
    """Both ranks completed, on two nodes, each having printed the gathered [1.0, 2.0]."""
    g = cluster.group(group_id)
    members = g["tasks"]
    out = {t["rank"]: cluster.logs(t["id"]) for t in members}
    assert g["status"] == "completed", (g["status"], g.get("reason"), out)
    for t in members:
        gathered = [m.group(1) for line in out[t["rank"]] if (m := GATHERED.match(line))]
        assert gathered == [str(t["rank"])], (t["rank"], out[t["rank"]][-15:])
    assert len({t["node_id"] for t in members}) == 2, members
    return list(members)


def coordinator(cluster: Cluster, task_id: str) -> str:
    """MASTER_ADDR:MASTER_PORT as the member saw them (its first line)."""
    lines = [x for x in cluster.logs(task_id) if x.startswith("coordinator ")]
    assert lines, cluster.logs(task_id)[-15:]
    return lines[0].split()[1]


def two_worlds(cluster: Cluster, **body: Any) -> list[dict[str, Any]]:
    """Two such groups at once on the same two nodes; both settled."""
    groups = [create_group(cluster, name=f"jax-{i}", **body) for i in (1, 2)]
    cluster.wait(
        lambda: all(settled(cluster, g["id"]) for g in groups), "both JAX groups settled", 150
    )
    return groups


def assert_worlds(cluster: Cluster, groups: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Each world gathered [1.0, 2.0] around one coordinator of its own, at an address of
    rank 0's node that is not loopback (rank 1 runs on another node)."""
    worlds, coordinators = [], set()
    for g in groups:
        members = assert_gathered(cluster, g["id"])
        seen = {coordinator(cluster, t["id"]) for t in members}
        assert len(seen) == 1, f"the members of one world were told different masters: {seen}"
        addr = next(iter(seen)).rpartition(":")[0]
        assert addr and not addr.startswith("127."), addr
        coordinators |= seen
        worlds.append(members)
    assert len(coordinators) == 2, f"the two worlds shared a coordinator: {coordinators}"
    return worlds


@requires_docker
@pytest.mark.docker
@pytest.mark.cluster_env(**ALLOW)
def test_two_jax_worlds_at_once_in_containers_on_two_agents(cluster: Cluster) -> None:
    missing = python_image_missing()
    if missing:
        pytest.skip(missing)
    cluster.start_agent("d1", "docker")
    cluster.start_agent("d2", "docker")
    groups = two_worlds(
        cluster,
        image=PYTHON_IMAGE,
        command=allgather_command("python3"),
        env={"PYTHONPATH": "/opt/jax", "HOME": "/tmp"},
        volumes=[{"host_path": str(JAX_DIR), "container_path": "/opt/jax", "read_only": True}],
    )
    assert_worlds(cluster, groups)


@pytest.mark.cluster_env(**ALLOW)
def test_two_jax_worlds_at_once_on_the_process_runtime_at_2048_mb(cluster: Cluster) -> None:
    cluster.start_agent("p1", "process")
    cluster.start_agent("p2", "process")
    groups = two_worlds(
        cluster,
        image="python:3.11",
        command=allgather_command(PYTHON),
        env={"PYTHONPATH": str(JAX_DIR)},
        memory_mb=2048,
    )
    # memory_mb bounds memory through the task's cgroup where the node has one, never the
    # address space (XLA reserves far more of it than it uses).
    cgroups = {n["id"]: n["inventory"].get("cgroups", "") for n in cluster.nodes()}
    for members in assert_worlds(cluster, groups):
        for t in members:
            assert cluster.task(t["id"])["memory_mb"] == 2048
            out = cluster.logs(t["id"])
            assert "address-space unlimited" in out, out[:5]
            if cgroups[t["node_id"]] in ("v1", "v2"):
                (caps,) = [x.split()[1:] for x in out if x.startswith("memory-cap ")]
                assert str(2048 * 1024 * 1024) in caps, (cgroups, caps)
