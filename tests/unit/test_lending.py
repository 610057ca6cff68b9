"""Card lending: the sleep evidence, the loan, the queued wake and its completion (domain), and
which pending tasks the scheduler places on a lent card (loans.py, ledger quota)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from libs.domain.errors import Code, Conflict, DomainError
from libs.domain.reasons import ReasonCode
from libs.domain.task.events import TaskStatusChanged
from libs.domain.task.evolve import evolve_task
from libs.domain.task.lending import (
    TaskCardBorrowed,
    TaskCardLent,
    TaskCardReturned,
    TaskWakeQueued,
    decide_borrow,
    decide_lend,
    decide_return,
    decide_wake,
    lendable,
    measure_sleep,
)
from libs.domain.task.model import Task, TaskId, TaskSpec, TaskType, TenantId
from libs.domain.task.states import Actor, TaskStatus
from services.scheduler.placement.ledger import Ledger
from services.scheduler.placement.loans import plan_loans
from services.scheduler.placement.model import (
    Allocation,
    ClusterSnapshot,
    Gpu,
    Node,
    PendingTask,
    Plan,
    Requirement,
    Unplaced,
)
from services.scheduler.placement.planner import Evaluation, plan
from services.scheduler.placement.reasons import Reason

NOW = datetime(2026, 1, 1, tzinfo=UTC)
S = TaskStatus


def task(status: TaskStatus = S.SLEEPING, **kw: Any) -> Task:
    spec = kw.pop("spec", TaskSpec(name="t", gpu_required=1))
    base: dict[str, Any] = {
        "id": TaskId("lender"),
        "tenant_id": TenantId("acme"),
        "spec": spec,
        "status": status,
        "node_id": "n1",
        "gpu_ids": ("n1-gpu0",),
        "created_at": NOW,
        "updated_at": NOW,
    }
    return Task(**(base | kw))


def fold(t: Task, events: list[Any]) -> Task:
    for i, e in enumerate(events):
        t = evolve_task(t, e, NOW, t.version + i + 1)
    return t


# --- evidence ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "before", "after", "released", "why"),
    [
        ("engine", 20000.0, 1000.0, True, ""),
        ("engine", 20000.0, 8000.0, True, ""),  # exactly 60 %
        ("engine", 20000.0, 12000.0, False, "released 40%"),
        ("pause", 20000.0, 1000.0, False, "paused"),  # frozen: never lent, whatever it reads
        ("engine", None, None, False, "no VRAM reading"),
        ("engine", 0.0, 0.0, False, "no VRAM reading"),
        ("", 20000.0, 1000.0, False, "paused"),
    ],
    ids=["engine-95pct", "engine-at-threshold", "engine-too-little", "paused", "no-reading",
         "nothing-held", "no-mode"],
)  # fmt: skip
def test_only_a_measured_engine_sleep_releases_the_card(
    mode: str, before: float | None, after: float | None, released: bool, why: str
) -> None:
    ev = measure_sleep(task(), "n1", mode, before, after, 0.6)
    assert ev.released is released
    assert why in ev.why
    assert (ev.vram_before_mb, ev.vram_after_mb, ev.min_released_fraction) == (before, after, 0.6)
    assert fold(task(), [ev]).sleep_released is released


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, True),
        ({"sleep_released": False}, False),
        ({"lent_to": "other"}, False),
        ({"status": S.RUNNING}, False),
        ({"spec": TaskSpec(name="t", gpu_memory_mb=4096)}, False),  # a fraction is shared
    ],
    ids=["released", "not-released", "already-lent", "awake", "fraction"],
)
def test_lendable(changes: dict[str, Any], expected: bool) -> None:
    assert lendable(task(**({"sleep_released": True} | changes))) is expected


# --- loan, queued wake, return ---------------------------------------------------------------


def test_a_loan_is_refused_when_the_lender_is_no_longer_lendable() -> None:
    with pytest.raises(Conflict):
        decide_lend(task(sleep_released=False), "b", "n1", ("n1-gpu0",))
    with pytest.raises(Conflict):
        decide_lend(task(sleep_released=True), "b", "n2", ("n1-gpu0",))  # another node
    events = decide_lend(task(sleep_released=True), "b", "n1", ("n1-gpu0",))
    assert events == [
        TaskCardLent(task_id="lender", borrower_task_id="b", node_id="n1", gpu_ids=("n1-gpu0",))
    ]
    assert fold(task(sleep_released=True), events).lent_to == "b"


def test_borrow_places_the_task_and_records_its_lender() -> None:
    borrower = task(S.PENDING, id="b", node_id=None, gpu_ids=())
    events = decide_borrow(borrower, "lender", "n1", ("n1-gpu0",), "nvidia/L4")
    placed, loan = events
    assert isinstance(placed, TaskStatusChanged) and placed.to_status is S.SCHEDULED
    assert placed.reason_code is ReasonCode.CARD_BORROWED
    assert isinstance(loan, TaskCardBorrowed) and loan.lender_task_id == "lender"
    after = fold(borrower, events)
    assert (after.status, after.node_id, after.gpu_ids) == (S.SCHEDULED, "n1", ("n1-gpu0",))
    assert after.borrowed_from == "lender"
    requeued = TaskStatusChanged(
        task_id="b",
        from_status=S.SCHEDULED,
        to_status=S.PENDING,
        actor="scheduler",
        reason_code=ReasonCode.NODE_LOST,
        clear_placement=True,
    )
    assert fold(after, [requeued]).borrowed_from == ""  # a new attempt borrows afresh


def test_waking_a_lender_queues_the_wake_once_and_an_unlent_sleeper_wakes_now() -> None:
    lent = task(sleep_released=True, lent_to="b")
    queued = decide_wake(lent, Actor.TENANT, ReasonCode.USER_WAKE, "wake requested")
    assert queued == [TaskWakeQueued(task_id="lender", borrower_task_id="b", actor="tenant")]
    after = fold(lent, queued)
    assert after.wake_queued and after.status is S.SLEEPING
    assert decide_wake(after, Actor.TENANT, ReasonCode.USER_WAKE, "") == []  # asked again
    now = decide_wake(task(sleep_released=True), Actor.TENANT, ReasonCode.USER_WAKE, "")
    assert isinstance(now[0], TaskStatusChanged) and now[0].to_status is S.WAKING
    with pytest.raises(DomainError) as exc:
        decide_wake(task(S.RUNNING), Actor.TENANT, ReasonCode.USER_WAKE, "")
    assert exc.value.code is Code.INVALID_STATUS_FOR_OPERATION


def test_the_return_runs_a_queued_wake_and_ends_the_loan() -> None:
    waiting = task(sleep_released=True, lent_to="b", wake_queued=True)
    events = decide_return(waiting, "b", "completed")
    returned, woken = events
    assert isinstance(returned, TaskCardReturned) and returned.wake
    assert isinstance(woken, TaskStatusChanged) and woken.to_status is S.WAKING
    assert woken.reason_code is ReasonCode.LENT_CARD_RETURNED
    after = fold(waiting, events)
    assert (after.status, after.lent_to, after.wake_queued) == (S.WAKING, "", False)
    # No queued wake: the card comes back and the sleeper stays asleep (lendable again).
    quiet = fold(
        task(sleep_released=True, lent_to="b"), decide_return(task(lent_to="b"), "b", "failed")
    )
    assert (quiet.status, quiet.lent_to, lendable(quiet)) == (S.SLEEPING, "", True)


def test_a_stopped_lender_has_nothing_to_return_or_wake() -> None:
    stopping = TaskStatusChanged(
        task_id="lender",
        from_status=S.SLEEPING,
        to_status=S.STOPPING,
        actor="tenant",
        reason_code=ReasonCode.USER_STOP,
    )
    stopped = fold(task(sleep_released=True, lent_to="b", wake_queued=True), [stopping])
    assert (stopped.lent_to, stopped.wake_queued, stopped.sleep_released) == ("", False, False)
    assert decide_return(stopped, "b", "completed") == []


# --- the scheduler -----------------------------------------------------------------------


def node(node_id: str = "n1", cards: int = 1, memory: int = 64 * 1024) -> Node:
    gpus = tuple(Gpu(f"{node_id}-gpu{i}", i, "nvidia", "L4", 23034) for i in range(cards))
    return Node(node_id, True, memory, 16, gpus)


def sleeper(tenant: str = "acme", *, lendable: bool = True, cards: int = 1) -> Allocation:
    ids = tuple(f"n1-gpu{i}" for i in range(cards))
    return Allocation("lender", tenant, "n1", S.SLEEPING, ids, memory_mb=2048, cpu_cores=1,
                      lendable=lendable)  # fmt: skip


def waiting(
    task_id: str = "b",
    tenant: str = "acme",
    *,
    kind: TaskType = TaskType.TRAINING,
    gpus: int = 1,
    memory: int = 2048,
    **extra: Any,
) -> PendingTask:
    req = Requirement(gpu_count=gpus, memory_mb=memory)
    return PendingTask(task_id, tenant, req, NOW, task_type=kind.value, **extra)


def loans_for(pending: list[PendingTask], *allocs: Allocation, n: Node | None = None) -> list[str]:
    snap = ClusterSnapshot(NOW, (n or node(),), allocs)
    result = plan(snap, pending)
    return [
        f"{ln.borrower_task_id}<-{ln.lender_task_id}" for ln in plan_loans(snap, pending, result)
    ]


@pytest.mark.parametrize(
    ("pending", "lender", "expected"),
    [
        ([waiting()], sleeper(), ["b<-lender"]),
        ([waiting(tenant="other")], sleeper(), []),
        ([waiting(kind=TaskType.INFERENCE)], sleeper(), []),
        ([waiting(kind=TaskType.BATCH)], sleeper(), []),
        ([waiting()], sleeper(lendable=False), []),  # paused, or not measured free
        ([waiting(gpus=2)], sleeper(), []),  # more cards than the lender has
        ([waiting(memory=63 * 1024)], sleeper(), []),  # the node's memory is still held
        ([waiting(gang_id="g", gang_size=1)], sleeper(), []),
        ([waiting(queue="q")], sleeper(), []),
        ([waiting(excluded_node_ids=frozenset({"n1"}))], sleeper(), []),
        ([waiting("b1"), waiting("b2")], sleeper(), ["b1<-lender"]),  # one borrower a lender
    ],
    ids=["same-tenant-training", "other-tenant", "inference", "batch", "not-released",
         "too-many-cards", "no-memory", "gang", "queue", "excluded-node", "one-at-a-time"],
)  # fmt: skip
def test_only_a_training_task_of_the_tenant_borrows_a_released_card(
    pending: list[PendingTask], lender: Allocation, expected: list[str]
) -> None:
    assert loans_for(pending, lender) == expected


def test_a_free_card_is_used_before_a_lent_one() -> None:
    snap_node = node(cards=2)
    assert loans_for([waiting()], sleeper(), n=snap_node) == []  # the plan placed it


def test_a_lent_card_is_counted_once_in_the_quota() -> None:
    lender = sleeper()
    borrower = Allocation("b", "acme", "n1", S.RUNNING, ("n1-gpu0",), borrowed_from="lender")
    snap = ClusterSnapshot(NOW, (node(),), (lender, borrower), tenant_quotas={"acme": 1})
    ev = Evaluation.of(snap)
    assert Ledger(ev.index, snap.allocations, ev.gpus).tenant_used["acme"] == 1.0
    # Once the lender is gone, the borrower's card is its own.
    alone = (borrower,)
    assert Ledger(ev.index, alone, ev.gpus).tenant_used["acme"] == 1.0
    # A quota-bound tenant still borrows: the card is already counted on the lender.
    snap = ClusterSnapshot(NOW, (node(),), (lender,), tenant_quotas={"acme": 1})
    result = plan(snap, [waiting()])
    assert result.unplaced[0].reason in (Reason.TENANT_QUOTA_EXCEEDED, Reason.INSUFFICIENT_GPUS)
    assert [ln.borrower_task_id for ln in plan_loans(snap, [waiting()], result)] == ["b"]


def test_only_the_plans_capacity_answers_are_cured_by_a_loan() -> None:
    snap = ClusterSnapshot(NOW, (node(),), (sleeper(),))
    backoff = Plan(unplaced=(Unplaced("b", Reason.BACKOFF, "later"),))
    assert plan_loans(snap, [waiting()], backoff) == ()
    gpus = Plan(unplaced=(Unplaced("b", Reason.INSUFFICIENT_GPUS, "full"),))
    assert [ln.gpu_ids for ln in plan_loans(snap, [waiting()], gpus)] == [("n1-gpu0",)]
    offline = ClusterSnapshot(NOW, (replace(node(), online=False),), (sleeper(),))
    assert plan_loans(offline, [waiting()], gpus) == ()
