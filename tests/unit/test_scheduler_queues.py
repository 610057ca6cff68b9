"""Queue admission in the planner: the queue's quota first, then its pools (seed 004)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from services.scheduler.placement.model import ClusterSnapshot, Node, PendingTask, Plan, QueueLimits
from services.scheduler.placement.planner import plan
from services.scheduler.placement.reasons import Reason

from .test_scheduler_planner import NOW, mk_alloc, mk_node, mk_task


def pooled(node_id: str, *pools: str, gpus: int = 4, model: str = "A100-80GB") -> Node:
    return replace(mk_node(node_id, gpus, model=model), pools=frozenset(pools))


def qtask(task_id: str, queue: str, *, gpus: int = 1, job: str = "", **kw: object) -> PendingTask:
    return replace(mk_task(task_id, gpus=gpus, **kw), queue=queue, job=job)  # type: ignore[arg-type]


def qalloc(task_id: str, node: str, cards: tuple[int, ...], queue: str, job: str = "") -> object:
    return replace(mk_alloc(task_id, node, cards), queue=queue, job=job)


A100 = (pooled("a1", "a100"), pooled("a2", "a100"), pooled("h1", "h100", model="H100"))
X4 = QueueLimits("x", frozenset({"a100"}), max_gpus=4)
Y = QueueLimits("y", frozenset({"a100"}))


def run(nodes: tuple[Node, ...], queues: list[QueueLimits], pending: list[PendingTask], allocs=()):  # type: ignore[no-untyped-def]
    snap = ClusterSnapshot(NOW, nodes, tuple(allocs), {}, {q.name: q for q in queues})
    return plan(snap, pending)


def reasons(result: Plan) -> Counter[Reason]:
    return Counter(u.reason for u in result.unplaced)


# (nodes, queues, holding, pending, placed ids, {reason: count}, id)
CASES = [
    (
        A100,
        [X4, Y],
        [],
        [qtask(f"x{i}", "x", age_s=20 - i) for i in range(6)]
        + [qtask(f"y{i}", "y", age_s=10 - i) for i in range(6)],
        {"x0", "x1", "x2", "x3", "y0", "y1", "y2", "y3"},
        {Reason.QUEUE_QUOTA_EXCEEDED: 2, Reason.POOL_CAPACITY: 2},
        "two-queues-one-pool-max-gpus",
    ),
    (
        A100,
        [X4],
        [qalloc("held", "a1", (0, 1, 2), "x")],
        [qtask("t", "x", gpus=2)],
        set(),
        {Reason.QUEUE_QUOTA_EXCEEDED: 1},
        "held-cards-count",
    ),
    (
        A100,
        [replace(Y, max_running_tasks=2)],
        [qalloc("held", "a1", (0,), "y")],
        [qtask("t1", "y", age_s=2), qtask("t2", "y", age_s=1)],
        {"t1"},
        {Reason.QUEUE_QUOTA_EXCEEDED: 1},
        "max-running-tasks",
    ),
    (
        A100,
        [replace(Y, max_running_jobs=1)],
        [],
        [
            qtask("a1", "y", job="A", age_s=3),
            qtask("a2", "y", job="A", age_s=2),
            qtask("b1", "y", job="B", age_s=1),
        ],
        {"a1", "a2"},
        {Reason.QUEUE_QUOTA_EXCEEDED: 1},
        "max-running-jobs-one-at-a-time",
    ),
    (
        A100,
        [replace(Y, max_running_jobs=1)],
        [qalloc("held", "a1", (0,), "y", job="A")],
        [qtask("a2", "y", job="A"), qtask("c1", "y", job="C")],
        {"a2"},
        {Reason.QUEUE_QUOTA_EXCEEDED: 1},
        "a-running-job-may-grow",
    ),
    (
        A100,
        [replace(X4, max_gpus=1)],
        [qalloc("held", "a1", (0,), "x")] + [mk_alloc(f"o{i}", "a2", (i,)) for i in range(4)],
        [qtask("t", "x")],
        set(),
        {Reason.QUEUE_QUOTA_EXCEEDED: 1},
        "queue-quota-is-checked-before-pool",
    ),
    (
        A100,
        [Y],
        [mk_alloc("o1", "a1", (0, 1, 2, 3)), mk_alloc("o2", "a2", (0, 1, 2, 3))],
        [qtask("t", "y")],
        set(),
        {Reason.POOL_CAPACITY: 1},
        "pool-full-while-other-nodes-are-free",
    ),
    (
        A100,
        [QueueLimits("h", frozenset({"nowhere"}))],
        [],
        [qtask("t", "h")],
        set(),
        {Reason.NOT_IN_POOL: 1},
        "pool-without-nodes",
    ),
    (
        A100,
        [],
        [],
        [qtask("t", "gone")],
        set(),
        {Reason.QUEUE_QUOTA_EXCEEDED: 1},
        "deleted-queue-admits-nothing",
    ),
    (
        A100,
        [Y],
        [],
        [mk_task("plain", gpus=1)],
        {"plain"},
        {},
        "task-outside-queues-goes-anywhere",
    ),
]


@pytest.mark.parametrize(
    ("nodes", "queues", "allocs", "pending", "placed", "why"),
    [c[:6] for c in CASES],
    ids=[c[6] for c in CASES],
)
def test_queue_then_pool_admission(  # type: ignore[no-untyped-def]
    nodes, queues, allocs, pending, placed, why
) -> None:
    result = run(nodes, queues, pending, allocs)
    assert {p.task_id for p in result.placements} == placed
    assert reasons(result) == Counter(why)


def test_pool_tasks_never_land_outside_the_pool() -> None:
    result = run(A100, [Y], [qtask(f"t{i}", "y") for i in range(12)])
    assert len(result.placements) == 8
    assert {p.node_id for p in result.placements} == {"a1", "a2"}
    full = result.unplaced_for("t11") or result.unplaced[0]
    assert full.reason is Reason.POOL_CAPACITY
    assert "pool(s) a100 of queue 'y' full" in full.message


def test_queue_quota_message_names_the_limit() -> None:
    result = run(A100, [X4], [qtask("t", "x", gpus=5)])
    assert "queue 'x' max_gpus is 4" in result.unplaced[0].message


def test_queue_priority_comes_before_task_priority() -> None:
    hi = QueueLimits("hi", frozenset({"h100"}), priority=10)
    lo = QueueLimits("lo", frozenset({"h100"}), priority=1)
    pending = [qtask("lo-urgent", "lo", gpus=4, priority=60), qtask("hi-calm", "hi", gpus=4)]
    result = run(A100, [hi, lo], pending)
    assert [p.task_id for p in result.placements] == ["hi-calm"]


def test_fifo_queue_ignores_task_priority() -> None:
    fifo = QueueLimits("f", frozenset({"h100"}), fifo=True)
    pending = [qtask("old", "f", gpus=4, age_s=10), qtask("new-urgent", "f", gpus=4, priority=60)]
    assert [p.task_id for p in run(A100, [fifo], pending).placements] == ["old"]
    prio = replace(fifo, fifo=False)
    assert [p.task_id for p in run(A100, [prio], pending).placements] == ["new-urgent"]


def test_preemption_weighs_queue_priority_first() -> None:
    hi = QueueLimits("hi", frozenset({"h100"}), priority=10)
    lo = QueueLimits("lo", frozenset({"h100"}), priority=1)
    victim = replace(mk_alloc("v", "h1", (0, 1, 2, 3), preemptible=True, priority=50), queue="lo")
    result = run(A100, [hi, lo], [qtask("t", "hi", gpus=4, priority=5)], [victim])
    assert [p.victims for p in result.preemptions] == [("v",)]
    # The same task priorities inside one queue: the lower task priority may not preempt.
    same = replace(victim, queue="hi")
    assert not run(A100, [hi], [qtask("t", "hi", gpus=4, priority=5)], [same]).preemptions
