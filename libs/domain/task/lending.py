"""Card lending (seed 000, lazy wake): a sleeping task's card lent to a training task of its
tenant, and the wake that waits for the borrower to end. Pure: events in, events out.

A card is lendable only on evidence: the agent slept the task through its engine
(`POST /sleep?level=1`) and measured the card's VRAM before and after; when at least the
configured fraction was released, `TaskSleepMeasured.released` is true. A paused container
keeps its memory and is never lent; a sleep with no reading is not lent either.

The scheduler records a loan on both tasks (`TaskCardLent` on the lender, `TaskCardBorrowed`
beside the borrower's placement). Waking a lender whose card is lent queues the wake
(`TaskWakeQueued`, the API answers 202 `queued`); when the borrower no longer holds the card
the scheduler records `TaskCardReturned` and, for a queued wake, moves the lender to `waking`.
docs/serving.md#card-lending.
"""

from __future__ import annotations

from typing import ClassVar

from libs.domain.errors import Code, Conflict, DomainError
from libs.domain.payload import Payload, register
from libs.domain.reasons import ReasonCode
from libs.domain.task.decide import decide_transition
from libs.domain.task.events import TaskStatusChanged
from libs.domain.task.evolve import TASK_FOLDS
from libs.domain.task.model import Task, TaskId, TaskType
from libs.domain.task.states import Actor, TaskStatus
from libs.domain.task.variants import placed_spec

S = TaskStatus
ENGINE_MODE = "engine"  # the agent's sleep_mode when the engine's /sleep answered


class TaskSleepMeasured(Payload):
    """How the agent put the task to sleep and the VRAM its cards held before and after;
    `released` says whether that frees the card for lending, `why` says why not."""

    type: ClassVar[str] = "task_sleep_measured"
    stream_type: ClassVar[str] = "task"

    task_id: TaskId
    node_id: str
    sleep_mode: str  # "engine" (its /sleep endpoint) or "pause" (frozen: no memory freed)
    vram_before_mb: float | None = None
    vram_after_mb: float | None = None
    released_fraction: float | None = None
    min_released_fraction: float
    released: bool
    why: str = ""


class TaskCardLent(Payload):
    """The lender's card(s) are lent to `borrower_task_id`."""

    type: ClassVar[str] = "task_card_lent"
    stream_type: ClassVar[str] = "task"

    task_id: TaskId
    borrower_task_id: str
    node_id: str
    gpu_ids: tuple[str, ...]


class TaskCardBorrowed(Payload):
    """The borrower runs on the card(s) of `lender_task_id` (appended with its placement)."""

    type: ClassVar[str] = "task_card_borrowed"
    stream_type: ClassVar[str] = "task"

    task_id: TaskId
    lender_task_id: str
    node_id: str
    gpu_ids: tuple[str, ...]


class TaskWakeQueued(Payload):
    """A wake of a lender: it runs when the borrower ends."""

    type: ClassVar[str] = "task_wake_queued"
    stream_type: ClassVar[str] = "task"

    task_id: TaskId
    borrower_task_id: str
    actor: str
    reason_code: ReasonCode = ReasonCode.WAKE_QUEUED


class TaskCardReturned(Payload):
    """The borrower no longer holds the lender's card (it ended or went back to pending)."""

    type: ClassVar[str] = "task_card_returned"
    stream_type: ClassVar[str] = "task"

    task_id: TaskId
    borrower_task_id: str
    borrower_status: str  # the borrower's status when the card came back
    wake: bool  # a queued wake runs now


register(TaskSleepMeasured, TaskCardLent, TaskCardBorrowed, TaskWakeQueued, TaskCardReturned)
TASK_FOLDS[TaskSleepMeasured] = lambda t, e: {"sleep_released": e.released}
TASK_FOLDS[TaskCardLent] = lambda t, e: {"lent_to": e.borrower_task_id}
TASK_FOLDS[TaskCardBorrowed] = lambda t, e: {"borrowed_from": e.lender_task_id}
TASK_FOLDS[TaskWakeQueued] = lambda t, e: {"wake_queued": True}
TASK_FOLDS[TaskCardReturned] = lambda t, e: {"lent_to": ""}


# --- evidence ----------------------------------------------------------------------------


def measure_sleep(
    task: Task,
    node_id: str,
    mode: str,
    before: float | None,
    after: float | None,
    min_released_fraction: float,
) -> TaskSleepMeasured:
    """The evidence of one sleep: released only through the engine, with both readings, and
    at least `min_released_fraction` of the memory freed."""
    fraction = None
    if before is not None and after is not None and before > 0:
        fraction = round(max(0.0, before - after) / before, 4)
    why = ""
    if mode != ENGINE_MODE:
        why = "paused, not slept through an engine: a frozen process keeps its memory"
    elif fraction is None:
        why = "no VRAM reading before and after the sleep"
    elif fraction < min_released_fraction:
        why = f"released {fraction:.0%} of its memory, less than {min_released_fraction:.0%}"
    return TaskSleepMeasured(
        task_id=task.id,
        node_id=node_id,
        sleep_mode=mode or "pause",
        vram_before_mb=before,
        vram_after_mb=after,
        released_fraction=fraction,
        min_released_fraction=min_released_fraction,
        released=not why,
        why=why,
    )


def lendable(task: Task) -> bool:
    """A sleeping task whose whole card(s) were measured free and are not lent yet."""
    return (
        task.status is S.SLEEPING
        and task.sleep_released
        and not task.lent_to
        and placed_spec(task).gpu_required > 0  # with variants, the placed one's cards
        and bool(task.gpu_ids)
    )


def may_borrow(task_type: TaskType | str, tenant_id: str, lender_tenant_id: str) -> bool:
    """Only a training task of the lender's tenant borrows (seed 000)."""
    return str(task_type) == TaskType.TRAINING.value and tenant_id == lender_tenant_id


# --- decisions ---------------------------------------------------------------------------


def decide_lend(
    lender: Task,
    borrower_id: str,
    node_id: str,
    gpu_ids: tuple[str, ...],
    borrower_tenant_id: str = "",
) -> list[Payload]:
    """Lend `gpu_ids` of `lender` to `borrower_id`; Conflict when it is no longer lendable
    (woken, stopped, already lent since the scheduler looked). A card is lent within its
    tenant only: a borrower of another tenant is refused (FORBIDDEN), nothing recorded."""
    if borrower_tenant_id and borrower_tenant_id != lender.tenant_id:
        raise DomainError(
            Code.FORBIDDEN, f"task {lender.id} lends its card within its own tenant only"
        )
    if not lendable(lender) or lender.node_id != node_id or not set(gpu_ids) <= set(lender.gpu_ids):
        raise Conflict(f"task {lender.id} is no longer lendable (status {lender.status.value})")
    return [
        TaskCardLent(
            task_id=lender.id, borrower_task_id=borrower_id, node_id=node_id, gpu_ids=gpu_ids
        )
    ]


def decide_borrow(
    borrower: Task, lender_id: str, node_id: str, gpu_ids: tuple[str, ...], gpu_label: str
) -> list[Payload]:
    """Place a pending training task on a lent card: its placement and the loan."""
    placed = decide_transition(
        borrower,
        S.SCHEDULED,
        actor=Actor.SCHEDULER,
        expected_status=S.PENDING,
        reason_code=ReasonCode.CARD_BORROWED,
        reason=f"placed on the card of sleeping task {lender_id}",
        node_id=node_id,
        gpu_ids=gpu_ids,
        qos="",
        gpu_label=gpu_label,
    )
    loan = TaskCardBorrowed(
        task_id=borrower.id, lender_task_id=lender_id, node_id=node_id, gpu_ids=gpu_ids
    )
    return [*placed, loan]


def decide_wake(task: Task, actor: Actor, reason_code: ReasonCode, reason: str) -> list[Payload]:
    """Wake a sleeping task: queued while its card is lent, else `waking` now."""
    if task.status is not S.SLEEPING:
        raise DomainError(
            Code.INVALID_STATUS_FOR_OPERATION,
            f"task is not sleeping, current status: {task.status.value}",
        )
    if task.lent_to:
        if task.wake_queued:
            return []  # asked again: still queued, nothing new to record
        return [TaskWakeQueued(task_id=task.id, borrower_task_id=task.lent_to, actor=actor.value)]
    return list(
        decide_transition(
            task,
            S.WAKING,
            actor=actor,
            expected_status=S.SLEEPING,
            reason_code=reason_code,
            reason=reason,
        )
    )


def decide_return(lender: Task, borrower_id: str, borrower_status: str) -> list[Payload]:
    """The borrower `borrower_id` no longer holds the card: record the return and run a
    queued wake. Nothing when the loan is already over (recorded, or the lender moved on)."""
    if lender.status is not S.SLEEPING or lender.lent_to != borrower_id:
        return []
    wake = lender.wake_queued
    events: list[Payload] = [
        TaskCardReturned(
            task_id=lender.id,
            borrower_task_id=borrower_id,
            borrower_status=borrower_status,
            wake=wake,
        )
    ]
    if wake:
        changed: list[TaskStatusChanged] = decide_transition(
            lender,
            S.WAKING,
            actor=Actor.SCHEDULER,
            expected_status=S.SLEEPING,
            reason_code=ReasonCode.LENT_CARD_RETURNED,
            reason=f"card back from {borrower_id} ({borrower_status}): queued wake",
        )
        events += changed
    return events
