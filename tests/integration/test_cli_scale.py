"""`heteroflow groups scale` against a real control plane and a process-runtime agent:
running replicas are added and removed, static-world groups are refused."""

from __future__ import annotations

from typing import Any

import pytest

from . import web
from .cluster import Cluster
from .test_cli import hf

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def group(cluster: Cluster, gid: str) -> dict[str, Any]:
    r = web.get(f"{cluster.url}/api/v1/task-groups/{gid}", headers=cluster.tenant)
    assert r.status_code == 200, r.text
    return dict(r.json())


def running(cluster: Cluster, gid: str) -> list[int]:
    return sorted(t["rank"] for t in group(cluster, gid)["tasks"] if t["status"] == "running")


def scale_entries(cluster: Cluster, gid: str) -> int:
    r = web.get(f"{cluster.url}/api/v1/task-groups/{gid}/events", headers=cluster.tenant)
    return sum(1 for e in r.json()["events"] if e["kind"] == "group_scaled")


def test_scale_running_replicas_up_and_down(cluster: Cluster) -> None:
    cluster.start_agent("n1", "process")
    body = {"name": "web", "image": "busybox", "command": "sleep 300", "task_count": 1}
    body |= {"cpu_cores": 0.25, "memory_mb": 64}  # three fit on a small process node
    r = web.post(f"{cluster.url}/api/v1/task-groups", json=body, headers=cluster.tenant)
    assert r.status_code == 201, r.text
    gid = r.json()["id"]
    cluster.wait(lambda: running(cluster, gid) == [0], "rank 0 running")

    up = hf(cluster, "groups", "scale", gid, "3")
    assert up.returncode == 0, up.stderr
    assert up.stdout.startswith(f"{gid}: 3 replica(s) wanted")
    cluster.wait(lambda: running(cluster, gid) == [0, 1, 2], "three replicas running")

    down = hf(cluster, "groups", "scale", gid, "1")
    assert down.returncode == 0, down.stderr
    removed = group(cluster, gid)["superseded_tasks"]
    assert len(removed) == 2
    for task_id in removed:
        cluster.wait_status(task_id, "stopped")
        assert cluster.statuses(task_id)[-2:] == ["stopping", "stopped"]
    g = group(cluster, gid)
    assert running(cluster, gid) == [0] and g["replicas"] == 1
    cluster.wait(lambda: group(cluster, gid)["status"] == "running", "group running")

    cluster.wait(lambda: scale_entries(cluster, gid) == 2, "two scale entries on the timeline")

    body = {"name": "tr", "image": "busybox", "command": "true", "task_count": 2}
    r = web.post(
        f"{cluster.url}/api/v1/task-groups",
        json=body | {"task_type": "training"},
        headers=cluster.tenant,
    )
    refused = hf(cluster, "groups", "scale", r.json()["id"], "3")
    assert refused.returncode == 1 and "(code 40003)" in refused.stderr
    assert "static-world" in refused.stderr
