"""An agent that runs many tasks leaves nothing behind: no zombie, finished task directories
and exited containers bounded by the retention setting, logs answered within it; and an agent
declaring 64 CPUs runs 64 default-size tasks at once."""

from __future__ import annotations

import time

import httpx
import psutil
import pytest

from . import web
from .cluster import Cluster
from .conftest import requires_docker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KEEP = 20
MANY = 200
# Containers are slower to run (~0.2 s each on a CI machine): five times what is kept still
# shows the bound.
MANY_CONTAINERS = 5 * KEEP


def count(cluster: Cluster, status: str) -> int:
    r = web.get(
        f"{cluster.url}/api/v1/tasks",
        params={"status": status, "per_page": 1},
        headers=cluster.tenant,
        timeout=10,
    )
    assert r.status_code == 200, r.text
    return int(r.json()["total"])


def zombies(pid: int) -> list[int]:
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for kid in kids:
        try:
            if kid.status() == psutil.STATUS_ZOMBIE:
                out.append(kid.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def logs(cluster: Cluster, task_id: str) -> httpx.Response:
    return web.get(f"{cluster.url}/api/v1/tasks/{task_id}/logs", headers=cluster.tenant, timeout=10)


def check_logs_within_retention(cluster: Cluster, ids: list[str]) -> None:
    newest = logs(cluster, ids[-1])
    assert newest.status_code == 200 and newest.json()["logs"] == [f"done {len(ids) - 1}"]
    assert logs(cluster, ids[0]).status_code == 404  # past retention: removed


@pytest.mark.cluster_env(HETEROFLOW_SCHEDULE_BATCH="512")
def test_many_process_tasks_leave_no_zombie_and_bounded_directories(cluster: Cluster) -> None:
    cluster.start_agent(
        "h1",
        "process",
        HETEROFLOW_NODE_CPU_CORES="16",
        HETEROFLOW_NODE_MEMORY_MB="65536",
        HETEROFLOW_FINISHED_KEEP=str(KEEP),
    )
    agent_pid = cluster.agents["h1"].pid
    tasks_dir = cluster.root / "agents" / "h1" / "tasks"
    ids = [cluster.create(name=f"h{i}", command=f"echo done {i}")["id"] for i in range(MANY)]
    cluster.wait(lambda: count(cluster, "completed") == MANY, "all completed", timeout=300)

    def clean() -> bool:
        return not zombies(agent_pid) and len(list(tasks_dir.iterdir())) <= KEEP

    cluster.wait(clean, "no zombie, at most KEEP task directories", timeout=5)
    assert len(list(tasks_dir.iterdir())) == KEEP  # the newest are kept for their logs
    check_logs_within_retention(cluster, ids)


@requires_docker
@pytest.mark.docker
def test_many_docker_tasks_leave_exited_containers_bounded(cluster: Cluster) -> None:
    import docker

    client = docker.from_env()
    cluster.start_agent(
        "d1",
        "docker",
        HETEROFLOW_NODE_CPU_CORES="16",
        HETEROFLOW_NODE_MEMORY_MB="65536",
        HETEROFLOW_FINISHED_KEEP=str(KEEP),
    )
    ids = [
        cluster.create(name=f"d{i}", command=f"echo done {i}")["id"] for i in range(MANY_CONTAINERS)
    ]
    cluster.wait(
        lambda: count(cluster, "completed") == MANY_CONTAINERS, "all completed", timeout=600
    )

    def mine() -> list[object]:
        # The low-level list: `containers.list` inspects each container it lists, and one the
        # agent removes between the two is a NotFound.
        return list(client.api.containers(all=True, filters={"label": "heteroflow.node=d1"}))

    cluster.wait(lambda: len(mine()) <= KEEP, "at most KEEP exited containers", timeout=10)
    assert len(mine()) == KEEP
    assert not zombies(cluster.agents["d1"].pid)
    check_logs_within_retention(cluster, ids)


def test_declared_64_cpus_run_64_default_tasks_at_once(cluster: Cluster) -> None:
    cluster.start_agent(
        "c64",
        "process",
        HETEROFLOW_NODE_CPU_CORES="64",
        HETEROFLOW_NODE_MEMORY_MB=str(64 * 2048),
    )
    node = next(n for n in cluster.nodes() if n["id"] == "c64")
    assert node["inventory"]["cpu_cores"] == 64
    assert node["inventory"]["memory_mb"] == 64 * 2048
    # Default size: 1 CPU core, 2048 MB.
    for i in range(64):
        cluster.create(name=f"s{i}", command="sleep 30")
    started = time.monotonic()
    cluster.wait(lambda: count(cluster, "running") == 64, "64 running at once", timeout=60)
    assert time.monotonic() - started < 30  # all 64 at once, none finished yet
    assert count(cluster, "pending") == 0
