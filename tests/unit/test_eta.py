"""The "why pending" estimate (services/scheduler/placement/eta.py): table-driven, pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from libs.domain.task.states import TaskStatus
from services.scheduler.placement.eta import Holding, Runtime, end_of, estimate, runtime_of
from services.scheduler.placement.model import (
    Allocation,
    ClusterSnapshot,
    Gpu,
    Node,
    PendingTask,
    Requirement,
    Variant,
)
from services.scheduler.placement.reasons import Reason

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
R = Reason


def node(nid: str, cards: int) -> Node:
    gpus = tuple(Gpu(f"{nid}-g{i}", i, "nvidia", "A100", 40_960) for i in range(cards))
    return Node(nid, True, 65_536, 16, gpus, runtime="simulated")


def held(tid: str, nid: str, cards: int, tenant: str = "acme", first: int = 0) -> Allocation:
    ids = tuple(f"{nid}-g{i}" for i in range(first, first + cards))
    return Allocation(tid, tenant, nid, TaskStatus.RUNNING, gpu_ids=ids, memory_mb=1024)


def want(tid: str, cards: int, *, minutes_ago: int = 0, tenant: str = "acme") -> PendingTask:
    return PendingTask(
        tid, tenant, Requirement(gpu_count=cards), NOW - timedelta(minutes=minutes_ago)
    )


SNAP = ClusterSnapshot(NOW, (node("a", 2),), (held("h", "a", 2),), {"acme": 2.0})
TEN_MIN = Holding(NOW - timedelta(minutes=5), timeout_s=600)
TYPICAL = Holding(NOW - timedelta(minutes=1), runtime=Runtime(300, 120, 600, 10))


@pytest.mark.parametrize(
    ("reason", "holding", "at", "low", "high"),
    [
        (R.INSUFFICIENT_GPUS, {"h": TEN_MIN}, 5, 0, 5),
        (R.INSUFFICIENT_GPUS, {"h": TYPICAL}, 4, 1, 9),
        (R.INSUFFICIENT_GPUS, {}, None, None, None),
        (None, {"h": TEN_MIN}, 5, 0, 5),  # not evaluated yet: capacity is what it needs
        (R.TENANT_QUOTA_EXCEEDED, {"h": TEN_MIN}, 5, 0, 5),
        (R.GPU_TYPE_UNAVAILABLE, {"h": TEN_MIN}, None, None, None),
    ],
    ids=["timeout", "typical-runtime", "unbounded", "unevaluated", "tenant-quota", "no-such-type"],
)
def test_the_estimate_reads_what_holds_the_binding_resource(
    reason: Reason | None, holding: dict[str, Holding], at: int | None, low: int, high: int
) -> None:
    me = want("p", 2)
    info = estimate(SNAP, me, [me], holding, reason=reason)
    assert info.position == 1
    if at is None:
        assert info.eta is None and info.method
        return
    assert info.eta is not None
    got = tuple(
        (t - NOW) / timedelta(minutes=1) for t in (info.eta.at, info.eta.low, info.eta.high)
    )
    assert got == (at, low, high)


def test_work_ahead_counts_and_what_it_cannot_bound_is_unknown() -> None:
    first, second = want("p1", 2, minutes_ago=2), want("p2", 2, minutes_ago=1)
    line = [second, first]
    a = estimate(SNAP, first, line, {"h": TEN_MIN}, reason=R.INSUFFICIENT_GPUS)
    b = estimate(SNAP, second, line, {"h": TEN_MIN}, reason=R.INSUFFICIENT_GPUS)
    assert (a.position, b.position) == (1, 2)
    assert a.eta is not None and a.eta.at == NOW + timedelta(minutes=5)
    # Two cards free once, four are needed: the first runs without a bound after that.
    assert b.eta is None and "nothing bounds" in b.method


def test_free_capacity_is_now_and_backoff_is_its_end() -> None:
    idle = ClusterSnapshot(NOW, (node("a", 2),))
    me = want("p", 1)
    assert estimate(idle, me, [me], {}, reason=None).eta.at == NOW  # type: ignore[union-attr]
    later = NOW + timedelta(seconds=30)
    backing = PendingTask("p", "acme", Requirement(gpu_count=1), NOW, not_before=later)
    info = estimate(idle, backing, [backing], {}, reason=R.BACKOFF)
    assert info.eta is not None and (info.eta.at, info.stage) == (later, "backoff")


def test_a_typical_runtime_needs_samples_and_a_timeout_caps_it() -> None:
    assert runtime_of([10.0, 20.0]) is None
    r = runtime_of([10.0, 20.0, 30.0, 40.0, 50.0])
    assert r is not None and (r.median_s, r.samples) == (30.0, 5)
    capped = end_of(Holding(NOW, timeout_s=60, runtime=Runtime(300, 100, 900, 5)), NOW)
    assert capped is not None and capped.at == capped.high == NOW + timedelta(seconds=60)
    assert end_of(Holding(NOW), NOW) is None


def test_work_ahead_with_a_bound_is_replayed_forward() -> None:
    first, second = want("p1", 2, minutes_ago=2), want("p2", 2, minutes_ago=1)
    bounds = {"h": TEN_MIN, "p1": Holding(None, timeout_s=600)}
    info = estimate(SNAP, second, [first, second], bounds, reason=R.INSUFFICIENT_GPUS)
    # h frees the two cards at +5 min, p1 takes them for at most ten minutes, then p2.
    assert info.eta is not None and info.eta.at == NOW + timedelta(minutes=15)
    assert info.eta.low == NOW  # both may end at any moment


def test_a_smaller_task_behind_a_blocked_one_is_not_held_by_it() -> None:
    # The planner is greedy, not strict FIFO: one card frees, the one-card task takes it even
    # though a two-card task is ahead.
    snap = ClusterSnapshot(NOW, (node("a", 2),), (held("h1", "a", 1), held("h2", "a", 1, first=1)))
    big, small = want("big", 2, minutes_ago=2), want("small", 1, minutes_ago=1)
    bounds = {"h1": Holding(NOW, timeout_s=60), "h2": Holding(NOW, timeout_s=600)}
    info = estimate(snap, small, [big, small], bounds, reason=R.INSUFFICIENT_GPUS)
    assert info.eta is not None and info.eta.at == NOW + timedelta(seconds=60)


def test_a_task_with_variants_starts_with_the_earliest_one_not_before_it_is_considered() -> None:
    first = Variant(0, Requirement(gpu_count=4), wait_s=120)  # no node has four cards
    second = Variant(1, Requirement(gpu_count=1))
    me = PendingTask("p", "acme", Requirement(), NOW, variants=(first, second))
    info = estimate(SNAP, me, [me], {"h": TEN_MIN}, reason=R.INSUFFICIENT_GPUS)
    # h frees its cards at +5 min; the second variant is considered from +2 min.
    assert info.eta is not None and info.eta.at == NOW + timedelta(minutes=5)
    assert info.method.startswith("variants[1]")
    idle = ClusterSnapshot(NOW, (node("a", 2),))
    later = estimate(idle, me, [me], {}, reason=R.INSUFFICIENT_GPUS)
    assert later.eta is not None and later.eta.at == NOW + timedelta(minutes=2)
