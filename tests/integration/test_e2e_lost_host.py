"""No task stuck on a lost host: with its agent killed (SIGKILL), every task of the node
reaches an end once the node is offline, and a stop does not wait for a node that is gone."""

from __future__ import annotations

from typing import Any

import pytest

from . import web
from .cluster import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def post(cluster: Cluster, path: str) -> Any:
    r = web.post(f"{cluster.url}/api/v1/{path}", headers=cluster.tenant)
    assert r.status_code in (200, 202), r.text
    return r.json()


def stats(cluster: Cluster) -> dict[str, int]:
    r = web.get(f"{cluster.url}/api/v1/tasks/stats", headers=cluster.tenant)
    return dict(r.json()["by_status"])


@pytest.mark.cluster_env(HETEROFLOW_NODE_OFFLINE_AFTER_S="2")
def test_every_task_of_a_killed_agents_node_reaches_an_end(cluster: Cluster) -> None:
    cluster.start_agent("h1", "process", HETEROFLOW_NODE_CPU_CORES="8")
    asleep = cluster.create(command="sleep 300")
    stopped = cluster.create(command="sleep 300")
    r = web.post(
        f"{cluster.url}/api/v1/task-groups",
        json={"name": "g", "image": "busybox:latest", "command": "sleep 300", "task_count": 1},
        headers=cluster.tenant,
    )
    assert r.status_code == 201, r.text
    group, member = r.json()["id"], r.json()["tasks"][0]["id"]
    for task_id in (asleep["id"], stopped["id"], member):
        cluster.wait_status(task_id, "running")
    post(cluster, f"tasks/{asleep['id']}/sleep")
    post(cluster, f"task-groups/{group}/sleep")
    cluster.wait_status(member, "sleeping")

    cluster.kill_agent("h1")
    # Told to stop while its agent is dead and the node not yet declared offline.
    assert post(cluster, f"tasks/{stopped['id']}/stop")["status"] == "stopping"
    cluster.wait(
        lambda: [n["status"] for n in cluster.nodes() if n["id"] == "h1"] == ["offline"],
        "node h1 offline",
    )
    # Sleeping tasks are placed again (their paused process went with the node), the
    # stopping one ends in place: nothing holds the lost node's capacity or the quota.
    assert cluster.wait_status(asleep["id"], "pending", timeout=15)["node_id"] is None
    assert cluster.wait_status(member, "pending", timeout=15)["status_reason_code"] == "node_lost"
    assert cluster.wait_status(stopped["id"], "stopped", timeout=15)["status"] == "stopped"
    held = stats(cluster)
    assert sum(held[s] for s in ("sleeping", "waking", "stopping", "running")) == 0, held

    # After the loss: a group wake leaves nothing waking, a stop ends at once.
    post(cluster, f"task-groups/{group}/wake")
    assert cluster.task(member)["status"] == "pending"
    assert post(cluster, f"tasks/{asleep['id']}/stop")["status"] == "cancelled"
    r = web.delete(f"{cluster.url}/api/v1/tasks/{member}", headers=cluster.tenant)
    assert r.status_code == 200 and r.json()["status"] == "cancelled", r.text
