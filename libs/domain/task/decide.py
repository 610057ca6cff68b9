"""Task commands: `decide(task, command) -> events`, pure.

Each function checks the command against the current task and returns the events that record
it, or raises a DomainError. The store appends the events and folds them with `evolve_task`
in one transaction, so what the functions see is exactly what a compare-and-set holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from libs.domain.errors import Code, Conflict, DomainError
from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.task.events import (
    TaskConfigUpdated,
    TaskDeleted,
    TaskPendingReason,
    TaskStatusChanged,
)
from libs.domain.task.model import Task
from libs.domain.task.states import TERMINAL, Actor, IllegalTransition, TaskStatus, check_transition

# A command: the current task in, the events that record the decision out (or DomainError).
Decide = Callable[[Task], Sequence[Payload]]


def decide_transition(
    task: Task,
    to: TaskStatus,
    *,
    actor: Actor,
    expected_status: TaskStatus | None = None,
    report: bool = False,
    reason_code: ReasonCode,
    reason: str = "",
    **fields: Any,
) -> list[TaskStatusChanged]:
    """One status change, compare-and-set on `expected_status` when given.

    `reason_code` says why for programs (required: no consumer reads `reason`, the text).

    A miss on the expected status is a Conflict (409): somebody moved the task first, and
    nothing is written. An edge outside the whitelist is an illegal transition (40040).
    """
    if expected_status is not None and task.status is not expected_status:
        raise Conflict(
            f"expected status {expected_status.value} but task is {task.status.value}; "
            "nothing was changed"
        )
    try:
        check_transition(task.status, to, actor, report=report)
    except IllegalTransition as exc:
        raise DomainError(Code.ILLEGAL_TRANSITION, str(exc), ["status"]) from None
    # A device requeue (`requeues` set: the card failed, not the task) spends no retry.
    retrying = to is TaskStatus.PENDING and task.status is TaskStatus.FAILED
    if retrying and "requeues" not in fields and task.retry_count >= task.spec.max_retries:
        raise DomainError(
            Code.ILLEGAL_TRANSITION,
            f"retries exhausted ({task.retry_count}/{task.spec.max_retries})",
            ["status"],
        )
    return [
        TaskStatusChanged(
            task_id=task.id,
            from_status=task.status,
            to_status=to,
            actor=actor.value,
            reason_code=reason_code,
            reason=reason or reason_code.text,
            **fields,
        )
    ]


def decide_config_update(task: Task, changes: dict[str, Any]) -> list[TaskConfigUpdated]:
    if task.status in TERMINAL:
        raise DomainError(
            Code.NOT_PENDING,
            f"cannot update a task in terminal status {task.status.value}",
        )
    return [TaskConfigUpdated(task_id=task.id, changes=changes)]


def decide_pending_reason(task: Task, code: ReasonCode, reason: str) -> list[TaskPendingReason]:
    """Record why a pending task waits; nothing when it is unchanged (keeps streams short)."""
    if task.status is not TaskStatus.PENDING or (
        task.pending_reason_code is code and task.pending_reason == reason
    ):
        return []
    return [TaskPendingReason(task_id=task.id, reason_code=code, reason=reason)]


# Statuses where a stop request becomes `stopping` (the agent then ends the work).
_STOPPABLE = frozenset(
    {
        TaskStatus.SCHEDULED,
        TaskStatus.STARTING,
        TaskStatus.RUNNING,
        TaskStatus.SLEEPING,
        TaskStatus.WAKING,
    }
)
# Already on the way out: a second stop changes nothing.
_ENDING = frozenset({TaskStatus.STOPPING, TaskStatus.DRAINING, TaskStatus.PREEMPTING})


def decide_stop(
    task: Task, actor: Actor, code: ReasonCode = ReasonCode.USER_STOP, reason: str = ""
) -> list[TaskStatusChanged]:
    """Pending work is cancelled; placed work goes `stopping` (the agent reports `stopped`)."""
    if task.status in _ENDING:
        return []
    if task.status is TaskStatus.PENDING:
        to = TaskStatus.CANCELLED
    elif task.status in _STOPPABLE:
        to = TaskStatus.STOPPING
    else:
        raise DomainError(
            Code.INVALID_STATUS_FOR_OPERATION,
            f"task cannot be stopped, current status: {task.status.value}",
        )
    return decide_transition(task, to, actor=actor, reason_code=code, reason=reason)


def decide_sleep(task: Task, actor: Actor) -> list[TaskStatusChanged]:
    if task.status is not TaskStatus.RUNNING:
        raise DomainError(
            Code.INVALID_STATUS_FOR_OPERATION,
            f"task is not running, current status: {task.status.value}",
        )
    return decide_transition(
        task, TaskStatus.SLEEPING, actor=actor, reason_code=ReasonCode.USER_SLEEP
    )


def decide_delete(task: Task, actor: Actor) -> list[TaskStatusChanged | TaskDeleted]:
    """Logical delete; running work is stopped first (same transaction, then the agent ends it).

    The stream stays: the task disappears from queries, its events do not.
    """
    events: list[TaskStatusChanged | TaskDeleted] = []
    if task.status not in TERMINAL:
        events.extend(decide_stop(task, actor, ReasonCode.USER_DELETE))
    events.append(TaskDeleted(task_id=task.id))
    return events
