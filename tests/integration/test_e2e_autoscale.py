"""The AutoScaler end to end: busybox httpd replicas behind the router, a load generator, the
router's figures on the bus and the autoscaler service of `heteroflow up` (docs/autoscaling.md).

`auto_scale` is set with `heteroflow groups autoscale`. Load raises qps above target →
replicas grow to the computed count within two evaluation periods; load stops → after the
cooldown they shrink to min_replicas, rank 0 of the (non-split) group kept; every replica
stopped → the group comes back from zero.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import httpx
import psycopg
import pytest

from . import web
from .cluster import Cluster
from .conftest import requires_docker
from .test_cli import hf
from .test_e2e_serving import HTTPD, SERVING, ready_replicas

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.docker, requires_docker]

INTERVAL_S = 2.0
AUTO_SCALE: dict[str, Any] = {
    "metric": "qps",
    "target": 2,  # requests/s per replica: a few requests/s already asks for the max
    "min_replicas": 1,
    "max_replicas": 3,
    "cooldown_up_s": 1,
    "cooldown_down_s": 4,
}


def events(cluster: Cluster, gid: str, kind: str) -> list[tuple[dict[str, Any], datetime]]:
    with psycopg.connect(cluster.database_url) as conn:
        rows = conn.execute(
            "SELECT payload, occurred_at FROM events WHERE stream_id = %s AND type = %s"
            " ORDER BY version",
            (gid, kind),
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


def live(cluster: Cluster, gid: str) -> list[dict[str, Any]]:
    ended = {"completed", "failed", "cancelled", "stopped"}
    return [t for t in cluster.group(gid)["tasks"] if t["status"] not in ended]


class Load(web.Repeat):
    """Threads sending requests through the router until stopped, each on its own client."""

    def __init__(self, cluster: Cluster, target: str, threads: int = 2) -> None:
        super().__init__(threads, join_s=30.0)
        self.url = f"{cluster.url}/serve/{target}/index.html"
        self.headers = cluster.tenant
        self.sent = 0

    def _run(self) -> None:
        with httpx.Client(headers=self.headers, timeout=httpx.Timeout(20, connect=2)) as c:
            while not self.stop.is_set():
                try:
                    c.get(self.url)
                    self.sent += 1
                except httpx.HTTPError:
                    pass
                time.sleep(0.02)


@pytest.mark.cluster_env(
    HETEROFLOW_AUTOSCALE_INTERVAL_S=str(INTERVAL_S),
    HETEROFLOW_SERVE_METRICS_INTERVAL_S="0.5",
    HETEROFLOW_SERVE_WINDOW_S="3",
    HETEROFLOW_AUTOSCALE_METRIC_MAX_AGE_S="3",
    HETEROFLOW_AUTOSCALE_MIN_REPLICA_AGE_S="1",
)
def test_load_grows_replicas_they_shrink_after_it_and_come_back_from_zero(
    cluster: Cluster,
) -> None:
    cluster.start_agent("as1", "docker")
    body = {
        "name": "llm",
        "image": "busybox:latest",
        "task_type": "inference",
        "command": HTTPD,
        "serving": SERVING,
        "task_count": 1,
        "parallelism": "data_parallel",  # not split: rank 0 must survive every scale-down
        "cpu_cores": 0.25,
        "memory_mb": 64,
    }
    r = web.post(f"{cluster.url}/api/v1/task-groups", json=body, headers=cluster.tenant)
    assert r.status_code == 201, r.text
    gid = r.json()["id"]
    rank0 = r.json()["tasks"][0]["id"]
    cluster.wait(lambda: len(ready_replicas(cluster, gid)) == 1, "rank 0 ready", 60)
    a = AUTO_SCALE
    cli = hf(
        cluster,
        *("groups", "autoscale", gid, "--metric", "qps", "--target", str(a["target"])),
        *("--min", str(a["min_replicas"]), "--max", str(a["max_replicas"])),
        *("--cooldown-up", str(a["cooldown_up_s"]), "--cooldown-down", str(a["cooldown_down_s"])),
    )
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.strip() == (
        f"{gid}: autoscaling on qps target 2 per replica, 1..3 replicas "
        "(cooldowns up 1 s, down 4 s)"
    )

    with Load(cluster, gid) as load:
        cluster.wait(lambda: cluster.group(gid)["replicas"] == 3, "grown to max_replicas", 40)
        cluster.wait(lambda: len(ready_replicas(cluster, gid)) == 3, "three ready", 40)
    assert load.sent > 0
    decided = events(cluster, gid, "group_autoscale_decided")
    above = next(at for p, at in decided if (p["value"] or 0) > AUTO_SCALE["target"])
    reached = next(at for p, at in events(cluster, gid, "group_scaled") if p["to_replicas"] == 3)
    took = (reached - above).total_seconds()
    assert took <= 2 * INTERVAL_S + 0.5, f"{took:.1f} s from qps above target to 3 replicas"

    # load stopped: the sliding window empties, and after the down cooldown they shrink
    cluster.wait(lambda: cluster.group(gid)["replicas"] == 1, "shrunk to min_replicas", 40)
    cluster.wait(lambda: len(live(cluster, gid)) == 1, "removed replicas ended", 30)
    assert [(t["rank"], t["id"]) for t in live(cluster, gid)] == [(0, rank0)]
    scales = events(cluster, gid, "group_scaled")
    assert all(p["to_replicas"] >= AUTO_SCALE["min_replicas"] for p, _ in scales)
    down = [(p, at) for p, at in scales if p["to_replicas"] < p["from_replicas"]]
    last_up = max(at for p, at in scales if p["to_replicas"] > p["from_replicas"])
    assert (down[0][1] - last_up).total_seconds() >= AUTO_SCALE["cooldown_down_s"]

    # every replica stopped: the AutoScaler brings the group back to min_replicas
    r = web.post(f"{cluster.url}/api/v1/task-groups/{gid}/stop", headers=cluster.tenant)
    assert r.status_code == 200, r.text
    cluster.wait_status(rank0, "stopped", timeout=30)
    cluster.wait(
        lambda: any(
            p["why"] == "scale_from_zero"
            for p, _ in events(cluster, gid, "group_autoscale_decided")
        ),
        "a scale from zero",
        20,
    )
    cluster.wait(lambda: len(ready_replicas(cluster, gid)) == 1, "a new rank 0 ready", 60)
    [back] = live(cluster, gid)
    assert back["rank"] == 0 and back["id"] != rank0
    r = httpx.get(f"{cluster.url}/serve/{gid}/index.html", headers=cluster.tenant, timeout=20)
    assert r.status_code == 200 and r.text.strip() == f"hello from {back['id']}", r.text

    def timeline_scales() -> int:
        url = f"{cluster.url}/api/v1/task-groups/{gid}/events"
        entries = web.get(url, headers=cluster.tenant).json()["events"]
        return sum(1 for e in entries if e["kind"] == "group_scaled")

    scales = events(cluster, gid, "group_scaled")
    assert [p["source"] for p, _ in scales] == ["autoscaler"] * len(scales)
    cluster.wait(lambda: timeline_scales() == len(scales), "a timeline entry per scale", 20)
