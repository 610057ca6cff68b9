"""A graceful, connection-aware scale-down end to end (docs/autoscaling.md "Scale-down"):
three busybox httpd replicas of a `split` group behind the router, slow requests held open on
two of them, a manual scale to 2. The least busy replica (rank 0 here, not the highest rank)
is the one that goes: it is marked draining first, stopped once no router has a request on
it, and every request sent through the router meanwhile answers 2xx.

The replicas answer their health path only once told to (`/cgi-bin/up`, called on each
replica directly), so the slow requests can be pinned on ranks 1 and 2 before rank 0 serves.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from . import web
from .cluster import Cluster
from .conftest import requires_docker
from .test_e2e_autoscale import events
from .test_e2e_serving import SERVING, bus_metrics, ready_replicas

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.docker, requires_docker]

SLOW_S = 20
SLOW_HTTPD = rf"""mkdir -p /tmp/www/cgi-bin
echo "hello from $HETEROFLOW_TASK_ID" > /tmp/www/index.html
cat > /tmp/www/cgi-bin/slow <<'EOF'
#!/bin/sh
sleep {SLOW_S}
printf 'Content-Type: text/plain\r\n\r\nslow\n'
EOF
cat > /tmp/www/cgi-bin/up <<'EOF'
#!/bin/sh
echo ok > /tmp/www/healthz
printf 'Content-Type: text/plain\r\n\r\nup\n'
EOF
chmod +x /tmp/www/cgi-bin/slow /tmp/www/cgi-bin/up
exec httpd -f -p 8000 -h /tmp/www"""


class Requests:
    """Requests sent through the router on threads, every status code kept."""

    def __init__(self, cluster: Cluster, gid: str) -> None:
        self.base = f"{cluster.url}/serve/{gid}"
        self.headers = cluster.tenant
        self.codes: list[int | str] = []
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def _get(self, path: str) -> None:
        try:
            with httpx.Client(headers=self.headers, timeout=httpx.Timeout(60, connect=5)) as c:
                self.codes.append(c.get(f"{self.base}/{path}").status_code)
        except httpx.HTTPError as exc:
            self.codes.append(type(exc).__name__)

    def slow(self) -> None:
        t = threading.Thread(target=self._get, args=("cgi-bin/slow",), daemon=True)
        t.start()
        self.threads.append(t)

    def load(self) -> None:
        def run() -> None:
            while not self.stop.is_set():
                self._get("index.html")
                time.sleep(0.05)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.threads.append(t)

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(SLOW_S + 60)


def members(cluster: Cluster, gid: str) -> dict[int, dict[str, Any]]:
    return {t["rank"]: t for t in cluster.group(gid)["tasks"]}


def published(cluster: Cluster, gid: str) -> tuple[int, dict[str, int]]:
    m = bus_metrics(cluster, gid)
    return int(m["ready_replicas"]), dict(m["outstanding"])


@pytest.mark.cluster_env(
    HETEROFLOW_AUTOSCALE_INTERVAL_S="1",
    HETEROFLOW_SERVE_METRICS_INTERVAL_S="0.5",
    HETEROFLOW_SERVE_PROBE_INTERVAL_S="0.5",
    HETEROFLOW_AUTOSCALE_METRIC_MAX_AGE_S="3",
    HETEROFLOW_AUTOSCALE_MIN_REPLICA_AGE_S="1",
)
def test_a_split_group_sheds_its_least_busy_replica_draining_it_first(cluster: Cluster) -> None:
    cluster.start_agent("sd1", "docker")
    body = {
        "name": "llm",
        "image": "busybox:latest",
        "task_type": "inference",
        "command": SLOW_HTTPD,
        "serving": SERVING,
        "task_count": 3,
        "parallelism": "split",
        "cpu_cores": 0.25,
        "memory_mb": 64,
    }
    r = web.post(f"{cluster.url}/api/v1/task-groups", json=body, headers=cluster.tenant)
    assert r.status_code == 201, r.text
    gid = r.json()["id"]
    cluster.wait(
        lambda: all(
            t["status"] == "running" and t["serve_address"] for t in members(cluster, gid).values()
        ),
        "three replicas running",
        90,
    )
    by_rank = members(cluster, gid)
    ids = {rank: t["id"] for rank, t in by_rank.items()}

    def up(rank: int) -> None:
        r = httpx.get(f"http://{by_rank[rank]['serve_address']}/cgi-bin/up", timeout=10)
        assert r.status_code == 200, r.text

    # ranks 1 and 2 serve; two slow requests are held open on each
    up(1)
    up(2)
    cluster.wait(lambda: ready_replicas(cluster, gid) == {ids[1], ids[2]}, "ranks 1, 2 ready", 30)
    sent = Requests(cluster, gid)
    for _ in range(4):
        sent.slow()
    held = {ids[1]: 2, ids[2]: 2}
    cluster.wait(lambda: bus_metrics(cluster, gid)["outstanding"] == held, "slow requests held", 20)
    # rank 0 serves too: it has nothing in flight, it is the least busy
    up(0)
    cluster.wait(lambda: len(ready_replicas(cluster, gid)) == 3, "three ready", 30)
    sent.load()  # one thread: rank 0 has at most one quick request in flight

    def figures_seen() -> bool:
        ready, outstanding = published(cluster, gid)
        busy = {k: v for k, v in outstanding.items() if k != ids[0]}
        return ready == 3 and busy == held and outstanding.get(ids[0], 0) < 2

    cluster.wait(figures_seen, "the routers' figures: ranks 1 and 2 busy, three ready", 20)

    r = web.post(
        f"{cluster.url}/api/v1/task-groups/{gid}/scale",
        json={"replicas": 2},
        headers=cluster.tenant,
    )
    assert r.status_code == 200, r.text
    assert r.json()["replicas"] == 2

    cluster.wait(lambda: cluster.task(ids[0])["draining"], "rank 0's replica draining", 20)
    drained = cluster.task(ids[0])
    assert drained["status"] == "running", drained  # draining first, not stopped at once
    assert drained["rank"] == 2, drained  # it took the highest rank, beyond the size
    now = members(cluster, gid)
    assert {now[0]["id"], now[1]["id"]} == {ids[1], ids[2]}, now  # the busy ones kept, renumbered
    cluster.wait_status(ids[0], "stopped", timeout=30)
    changes = [p for p, _ in events(cluster, ids[0], "task_status_changed")]
    [stop] = [p for p in changes if p["to_status"] == "stopping"]
    assert (stop["from_status"], stop["reason_code"]) == ("running", "scaled_down"), stop
    assert [p["reason_code"] for p, _ in events(cluster, ids[0], "task_drain_marked")] == [
        "scaled_down"
    ]

    # the slow requests on the kept replicas end, answered
    sent.join()
    failed = [c for c in sent.codes if not (isinstance(c, int) and 200 <= c < 300)]
    assert len(sent.codes) > 4 and not failed, f"{len(failed)} of {len(sent.codes)}: {failed}"
    assert sent.codes.count(200) == len(sent.codes)
    live = [t for t in cluster.group(gid)["tasks"] if t["status"] == "running"]
    assert sorted((t["rank"], t["draining"]) for t in live) == [(0, False), (1, False)]
