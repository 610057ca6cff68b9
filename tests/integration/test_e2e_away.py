"""An agent away for three times the offline threshold (SIGSTOP, real NATS and PostgreSQL,
process runtime): its tasks end with what their processes really did, each run once; and a
task its node stops confirming is resolved by the sweep, with a timeline reason."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from . import web
from .cluster import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OFFLINE_S = 3.0  # the cluster fixture's HETEROFLOW_NODE_OFFLINE_AFTER_S


def runs(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def freeze(cluster: Cluster, node_id: str) -> None:
    cluster.agents[node_id].send_signal(signal.SIGSTOP)


def thaw(cluster: Cluster, node_id: str) -> None:
    cluster.agents[node_id].send_signal(signal.SIGCONT)


def test_agent_back_after_three_offline_thresholds_reports_real_outcomes(
    cluster: Cluster,
) -> None:
    cluster.start_agent("away1")
    marks = cluster.root / "runs"
    marks.mkdir()
    ok = cluster.create(
        command=f"echo x >> {marks}/ok; sleep 3; exit 0", max_retries=0, cpu_cores=0.1, memory_mb=64
    )
    bad = cluster.create(
        command=f"echo x >> {marks}/bad; sleep 3; exit 3",
        max_retries=0,
        cpu_cores=0.1,
        memory_mb=64,
    )
    # Still running when its agent is back, and placed there again at the same attempt.
    late = cluster.create(
        command=f"echo x >> {marks}/late; sleep 20; exit 0",
        max_retries=0,
        cpu_cores=0.1,
        memory_mb=64,
    )
    for t in (ok, bad, late):
        cluster.wait_status(t["id"], "running")
    freeze(cluster, "away1")
    away_since = time.monotonic()
    try:
        cluster.wait(
            lambda: any(n["id"] == "away1" and n["status"] == "offline" for n in cluster.nodes()),
            "away1 declared offline",
        )
        # Away for three times the threshold: the tasks' processes end meanwhile
        # (but `late`'s).
        cluster.wait(
            lambda: (
                time.monotonic() - away_since > 3 * OFFLINE_S
                and all(cluster.task(t["id"])["status"] == "pending" for t in (ok, bad, late))
            ),
            "three offline thresholds with the tasks back in pending",
        )
    finally:
        thaw(cluster, "away1")
    assert cluster.wait_status(ok["id"], "completed", "failed", timeout=60)["status"] == "completed"
    done = cluster.wait_status(bad["id"], "completed", "failed", timeout=60)
    assert done["status"] == "failed" and done["exit_code"] == 3
    back = cluster.wait_status(late["id"], "completed", "failed", timeout=60)
    assert back["status"] == "completed", (
        back["error"],
        back["exit_code"],
        cluster.statuses(late["id"])[4:],
    )
    assert [runs(marks / name) for name in ("ok", "bad", "late")] == [1, 1, 1]  # none twice
    assert "node_lost" in reasons(cluster, ok["id"])


@pytest.mark.cluster_env(
    HETEROFLOW_NODE_OFFLINE_AFTER_S="120", HETEROFLOW_TASK_UNCONFIRMED_AFTER_S="3"
)
def test_task_its_node_stops_confirming_is_resolved_by_the_sweep(cluster: Cluster) -> None:
    cluster.start_agent("quiet1")
    t = cluster.create(command="sleep 300", max_retries=0, cpu_cores=0.1, memory_mb=64)
    cluster.wait_status(t["id"], "running")
    freeze(cluster, "quiet1")  # no heartbeat: the node is not yet offline (120 s)
    try:
        cluster.wait(
            lambda: "task_unconfirmed" in reasons(cluster, t["id"]),
            "the sweep to resolve the unconfirmed task",
            timeout=60,
        )
    finally:
        thaw(cluster, "quiet1")
    entries = cluster_timeline(cluster, t["id"])
    assert [e["details"]["reason_code"] for e in entries if e["kind"] == "task_unconfirmed"] == [
        "task_unconfirmed"
    ]
    # Back, the agent still runs it: placed there again, it is confirmed running.
    assert cluster.wait_status(t["id"], "running", timeout=60)["status"] == "running"


def reasons(cluster: Cluster, task_id: str) -> list[str]:
    import psycopg

    with psycopg.connect(cluster.database_url) as conn:
        rows = conn.execute(
            "SELECT payload->>'reason_code' FROM events WHERE stream_id = %s"
            " AND type = 'task_status_changed' ORDER BY version",
            (task_id,),
        ).fetchall()
    return [r[0] for r in rows]


def cluster_timeline(cluster: Cluster, task_id: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 30
    while True:  # the timeline is derived after the event is published: poll for it
        r = web.get(f"{cluster.url}/api/v1/tasks/{task_id}/events", headers=cluster.tenant)
        assert r.status_code == 200, r.text
        entries: list[dict[str, Any]] = r.json()["events"]
        if any(e["kind"] == "task_unconfirmed" for e in entries) or time.monotonic() > deadline:
            return entries
        time.sleep(0.2)


def test_stray_of_a_task_placed_elsewhere_is_stopped_when_its_agent_returns(
    cluster: Cluster,
) -> None:
    import psutil

    cluster.start_agent("first1")
    pids = cluster.root / "pids"
    t = cluster.create(
        command=f"echo $$ >> {pids}; sleep 120", max_retries=0, cpu_cores=0.1, memory_mb=64
    )
    cluster.wait_status(t["id"], "running")
    cluster.wait(lambda: pids.exists() and pids.read_text().strip() != "", "the first run's pid")
    stray = int(pids.read_text().split()[0])
    freeze(cluster, "first1")
    try:
        cluster.start_agent("second1")
        cluster.wait(
            lambda: (
                cluster.task(t["id"])["node_id"] == "second1"
                and cluster.task(t["id"])["status"] == "running"
            ),
            "the task running on second1",
        )
    finally:
        thaw(cluster, "first1")

    def stopped() -> bool:
        try:
            return bool(psutil.Process(stray).status() == psutil.STATUS_ZOMBIE)
        except psutil.NoSuchProcess:
            return True

    cluster.wait(stopped, "first1's stray process stopped", timeout=60)
    assert cluster.task(t["id"])["status"] == "running"  # the moved task runs on
