"""A task without `image` runs as a plain process on a process node, and waits, named, where
only docker nodes exist."""

from __future__ import annotations

import pytest

from . import web
from .cluster import Cluster
from .conftest import requires_docker

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def create_without_image(cluster: Cluster, **body: object) -> dict[str, object]:
    r = web.post(
        f"{cluster.url}/api/v1/tasks",
        json={"name": "plain", "command": "echo plain"} | body,
        headers=cluster.tenant,
    )
    assert r.status_code == 201, r.text
    return dict(r.json())


@requires_docker
@pytest.mark.docker
def test_no_image_waits_for_a_process_node_then_runs_there(cluster: Cluster) -> None:
    cluster.start_agent("d1", "docker")
    t = create_without_image(cluster)
    assert t["image"] == ""
    nulled = create_without_image(cluster, image=None)  # null is the same as omitted
    assert nulled["image"] == ""
    tid = str(t["id"])
    cluster.wait(lambda: cluster.task(tid)["pending_reason"] != "", "a pending reason")
    task = cluster.task(tid)
    assert task["status"] == "pending"
    assert task["pending_reason_code"] == "runtime_unavailable"
    assert "process" in task["pending_reason"] and "docker" in task["pending_reason"]
    with_image = cluster.create(command="true")  # the docker node still takes image tasks
    cluster.wait_status(with_image["id"], "completed")

    cluster.start_agent("p1", "process")
    done = cluster.wait_status(tid, "completed")
    assert done["node_id"] == "p1"
    r = web.get(f"{cluster.url}/api/v1/tasks/{tid}/logs", headers=cluster.tenant)
    assert r.json()["logs"] == ["plain"]
