"""Agent restarts keep containers; GPU cards lost and recovered; fraction QoS on placement."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import psycopg
import pytest

from . import web
from .cluster import Cluster
from .conftest import requires_docker

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def readopted(log: Path, times: int) -> bool:
    """The agent's log says it re-adopted a container at least `times` times."""
    return log.read_text().count('"container_readopted"') >= times


def node_events(cluster: Cluster, node_id: str) -> list[str]:
    with psycopg.connect(cluster.database_url) as conn:
        rows = conn.execute(
            "SELECT type FROM events WHERE stream_id = %s ORDER BY version", (node_id,)
        ).fetchall()
    return [r[0] for r in rows]


@requires_docker
@pytest.mark.docker
@pytest.mark.cluster_env(HETEROFLOW_NODE_OFFLINE_AFTER_S="30")
def test_agent_sigkill_restarts_keep_containers_and_readopt(cluster: Cluster) -> None:
    import docker

    client = docker.from_env()
    cluster.start_agent("d1", "docker")
    t = cluster.create(command="while true; do sleep 0.2; done")
    running = cluster.wait_status(t["id"], "running")
    container = client.containers.get(running["container_id"])
    started_at = container.attrs["State"]["StartedAt"]
    log = cluster.root / "agent-d1.log"
    for restart in range(1, 4):
        cluster.kill_agent("d1")
        cluster.start_agent("d1", "docker")
        cluster.wait(partial(readopted, log, restart), f"re-adopted after restart {restart}")
        container.reload()
        assert container.status == "running"
        assert container.attrs["RestartCount"] == 0
        assert container.attrs["State"]["StartedAt"] == started_at
    assert cluster.task(t["id"])["status"] == "running"
    # Re-adopted: the restarted agent can still stop what its predecessor started.
    r = web.post(f"{cluster.url}/api/v1/tasks/{t['id']}/stop", headers=cluster.tenant)
    assert r.status_code == 200
    assert cluster.wait_status(t["id"], "stopped", "failed")["status"] == "stopped"
    container.reload()
    assert container.status == "exited"
    container.remove(force=True)


def test_gpu_card_lost_then_recovered(cluster: Cluster) -> None:
    cluster.start_agent("g1", "process", HETEROFLOW_DECLARED_GPUS="nvidia:L4:23034x2")
    node = [n for n in cluster.nodes() if n["id"] == "g1"][0]
    cards = [g["id"] for g in node["inventory"]["gpus"]]
    t = cluster.create(command="sleep 60", gpu_required=1)
    running = cluster.wait_status(t["id"], "running")
    card = running["gpu_ids"][0]
    hidden = cluster.root / "agents" / "g1" / "hidden_gpus"
    hidden.write_text(card + "\n")
    cluster.wait(lambda: "gpu_lost" in node_events(cluster, "g1"), "gpu_lost event")
    node = [n for n in cluster.nodes() if n["id"] == "g1"][0]
    assert node["excluded_gpus"] == [card]
    task = cluster.task(t["id"])
    assert task["status"] == "running" and task["node_id"] == "g1", "task neither moved nor failed"
    # The lost card is excluded from new placements: a second 1-card task gets the other one.
    other = cluster.create(command="sleep 60", gpu_required=1)
    placed = cluster.wait_status(other["id"], "running")
    assert placed["gpu_ids"] == [c for c in cards if c != card]
    hidden.write_text("")
    cluster.wait(lambda: "gpu_recovered" in node_events(cluster, "g1"), "gpu_recovered event")
    assert [n for n in cluster.nodes() if n["id"] == "g1"][0]["excluded_gpus"] == []
    assert node_events(cluster, "g1").count("gpu_lost") == 1


@pytest.mark.parametrize(
    ("declared", "qos"),
    [("nvidia:A100-80GB:81920", "silver"), ("amd:MI300X:196608", "bronze")],
    ids=["nvidia-silver", "amd-bronze"],
)
def test_fraction_gets_derived_qos(cluster: Cluster, declared: str, qos: str) -> None:
    cluster.start_agent("f1", "process", HETEROFLOW_DECLARED_GPUS=declared)
    t = cluster.create(command="true", gpu_memory_mb=8192)
    done = cluster.wait_status(t["id"], "completed")
    assert done["qos"] == qos and len(done["gpu_ids"]) == 1


def test_preemption_requeues_the_preemptible_task(cluster: Cluster) -> None:
    cluster.start_agent("p1", "process", HETEROFLOW_DECLARED_GPUS="nvidia:L4:23034")
    low = cluster.create(command="sleep 120", gpu_required=1, priority=10, preemptible=True)
    cluster.wait_status(low["id"], "running")
    high = cluster.create(command="sleep 120", gpu_required=1, priority=60)
    cluster.wait_status(high["id"], "running", timeout=40)
    history = cluster.statuses(low["id"])
    assert history[-2:] == ["preempting", "pending"], history
    assert cluster.task(low["id"])["status"] == "pending"
    assert "preempted" not in cluster.task(high["id"])["pending_reason"]
