"""The planner's bound on a node's in-flight starts (tasks scheduled or starting, not yet
running): a burst waits or spreads over other nodes instead of piling onto one agent."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from libs.domain.task.states import TaskStatus
from services.scheduler.placement.model import Node, PendingTask, Plan
from services.scheduler.placement.planner import plan
from services.scheduler.placement.reasons import Reason

from .test_scheduler_planner import mk_alloc, mk_node, mk_task, snap

S = TaskStatus


def cpu_node(node_id: str, bound: int, cpu: float = 64) -> Node:
    return replace(mk_node(node_id, gpus=0, cpu=cpu), max_starting=bound)


def burst(n: int) -> list[PendingTask]:
    return [mk_task(f"t{i:02}", age_s=n - i) for i in range(n)]


def per_node(result: Plan) -> Counter[str]:
    return Counter(p.node_id for p in result.placements)


# (bound, statuses already on the node, burst size, placed now)
BOUND_CASES = [
    (4, (), 10, 4, "burst-capped-at-bound"),
    (4, (S.SCHEDULED, S.STARTING), 10, 2, "scheduled-and-starting-count"),
    (4, (S.RUNNING,) * 10, 10, 4, "running-does-not-count"),
    (4, (S.SLEEPING, S.STOPPING, S.PREEMPTING), 10, 4, "only-starts-count"),
    (4, (S.STARTING,) * 5, 3, 0, "over-the-bound-places-none"),
    (0, (S.STARTING,) * 5, 10, 10, "zero-is-no-bound"),
]


@pytest.mark.parametrize(
    ("bound", "held", "n", "placed"),
    [c[:4] for c in BOUND_CASES],
    ids=[c[4] for c in BOUND_CASES],
)
def test_in_flight_starts_are_bounded(
    bound: int, held: tuple[TaskStatus, ...], n: int, placed: int
) -> None:
    allocs = [mk_alloc(f"h{i}", "n1", status=st) for i, st in enumerate(held)]
    result = plan(snap(cpu_node("n1", bound), allocs=allocs), burst(n))
    assert len(result.placements) == placed
    assert {u.reason for u in result.unplaced} <= {Reason.STARTS_IN_FLIGHT}
    assert len(result.unplaced) == n - placed
    assert not result.preemptions


def test_oldest_tasks_take_the_free_starts() -> None:
    result = plan(snap(cpu_node("n1", 3)), burst(8))
    assert sorted(p.task_id for p in result.placements) == ["t00", "t01", "t02"]
    unplaced = result.unplaced_for("t07")
    assert unplaced is not None
    assert unplaced.message == "node 'n1' is already starting 3 tasks (limit 3)"


def test_burst_spreads_over_nodes() -> None:
    nodes = [cpu_node(f"n{i}", 4) for i in range(3)]
    result = plan(snap(*nodes), burst(10))
    assert len(result.placements) == 10
    assert max(per_node(result).values()) == 4 and len(per_node(result)) == 3
    # Without the bound the bin-pack puts the whole burst on one node.
    unbounded = plan(snap(*(replace(n, max_starting=0) for n in nodes)), burst(10))
    assert len(per_node(unbounded)) == 1


def test_burst_beyond_every_node_waits_with_a_tally() -> None:
    result = plan(snap(cpu_node("n1", 2), cpu_node("n2", 2)), burst(6))
    assert per_node(result) == {"n1": 2, "n2": 2}
    unplaced = result.unplaced_for("t05")
    assert unplaced is not None and unplaced.reason is Reason.STARTS_IN_FLIGHT
    assert "2 nodes checked: 2 starts_in_flight" in unplaced.message


def test_lacking_capacity_is_named_before_the_bound() -> None:
    # A full node is full: that is what the user must hear, not that it is busy starting.
    allocs = [mk_alloc("h", "n1", status=S.STARTING)]
    result = plan(snap(cpu_node("n1", 1, cpu=0.5), allocs=allocs), burst(1))
    assert result.unplaced[0].reason is Reason.INSUFFICIENT_CPU


def test_bound_is_not_cured_by_preemption() -> None:
    victim = mk_alloc("low", "n1", status=S.SCHEDULED, preemptible=True, priority=0)
    task = mk_task("t", priority=10)
    result = plan(snap(cpu_node("n1", 1), allocs=[victim]), [task])
    assert result.unplaced_for("t") is not None
    assert result.unplaced[0].reason is Reason.STARTS_IN_FLIGHT
    assert not result.preemptions


@pytest.mark.parametrize(
    ("nodes", "placed"), [(1, 0), (2, 3)], ids=["one-node-gang-waits", "two-nodes-gang-spreads"]
)
def test_gang_counts_its_own_starts(nodes: int, placed: int) -> None:
    gang = [mk_task(f"g{i}", gang_id="g", gang_size=3) for i in range(3)]
    result = plan(snap(*(cpu_node(f"n{i}", 2) for i in range(nodes))), gang)
    assert len(result.placements) == placed
