"""The scheduler bounds a node's in-flight starts: a burst submitted before any node is up
is placed at most HETEROFLOW_SCHEDULE_MAX_STARTING_PER_NODE at a time per node, spreads over
both agents, and every task still completes."""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg
import pytest

from . import web
from .cluster import Cluster

pytestmark = [pytest.mark.integration]

BOUND = 3
BURST = 24
IN_FLIGHT = {"scheduled", "starting"}


def status_events(database_url: str) -> list[dict[str, Any]]:
    """Every task transition in position order. A transition the placer saw committed was
    given its position before the placer's own, so this order never shows fewer starts in
    flight than the placer knew of."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT payload FROM events WHERE type = 'task_status_changed' ORDER BY position"
        ).fetchall()
    return [row[0] for row in rows]


def most_in_flight(events: list[dict[str, Any]]) -> Counter[str]:
    """The largest number of tasks each node had scheduled or starting at one time."""
    node_of: dict[str, str] = {}
    flying: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    for e in events:
        task, src, dst = e["task_id"], e["from_status"], e["to_status"]
        if dst == "scheduled":
            node_of[task] = e["node_id"]
        node = node_of.get(task, "")
        flying[node] += (dst in IN_FLIGHT) - (src in IN_FLIGHT)
        peak[node] = max(peak[node], flying[node])
    return peak


def pending_reason_codes(database_url: str) -> set[str]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT DISTINCT payload->>'reason_code' FROM events WHERE type = 'task_pending_reason'"
        ).fetchall()
    return {row[0] for row in rows}


# The cluster's 3 s before a silent node is offline is for the node-loss tests; here a loaded
# CI machine once let a heartbeat run late, and the tasks of the node "lost" were placed again.
@pytest.mark.cluster_env(
    HETEROFLOW_SCHEDULE_MAX_STARTING_PER_NODE=str(BOUND), HETEROFLOW_NODE_OFFLINE_AFTER_S="30"
)
def test_burst_is_placed_within_the_bound_and_spreads(cluster: Cluster) -> None:
    ids = [cluster.create(name=f"b{i}", command="sleep 3")["id"] for i in range(BURST)]
    for node in ("s1", "s2"):
        cluster.start_agent(node, "process", HETEROFLOW_NODE_CPU_CORES="64")

    def all_completed() -> bool:
        # One request per poll (not one per task) on a loaded machine.
        r = web.get(f"{cluster.url}/api/v1/tasks/stats", headers=cluster.tenant)
        return r.status_code == 200 and r.json()["by_status"]["completed"] == BURST

    cluster.wait(all_completed, "the whole burst completed", timeout=180)
    assert {cluster.task(i)["status"] for i in ids} == {"completed"}
    events = status_events(cluster.database_url)
    peak = most_in_flight(events)
    assert max(peak[n] for n in ("s1", "s2")) == BOUND, peak  # reached, never passed
    ran_on = Counter(e["node_id"] for e in events if e["to_status"] == "scheduled")
    again = [e for e in events if e["to_status"] == "pending"]  # placed, then sent back: why
    assert set(ran_on) == {"s1", "s2"} and sum(ran_on.values()) == BURST, (ran_on, again)
    assert "starts_in_flight" in pending_reason_codes(cluster.database_url)
