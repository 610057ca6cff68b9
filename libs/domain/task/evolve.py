"""The task fold: events in order make the task (projections and replay share it)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.task.events import (
    TaskConfigUpdated,
    TaskCreated,
    TaskDeleted,
    TaskDrainMarked,
    TaskPendingReason,
    TaskRankMoved,
    TaskRetryDecided,
    TaskStatusChanged,
)
from libs.domain.task.model import RetryVerdict, Task, TaskSpec
from libs.domain.task.states import TaskStatus

# --- folds -------------------------------------------------------------------------------


# What a status change clears when it takes a task off its node, and the fields it carries
# onto the task when set (shared with replay's document fold, libs/store/replay_fold.py).
CLEARED_PLACEMENT: dict[str, Any] = {
    "node_id": None,
    "gpu_ids": (),
    "qos": "",
    "container_id": "",
    "serve_address": "",
    "gpu_label": "",
    "ports": {},
}
# `variant` is carried, never cleared: a requeue keeps which variant the last attempt ran
# (a GPU OOM retry moves past it: services/scheduler/placement/variants.py).
CARRIED_FIELDS = (*CLEARED_PLACEMENT, "engine", "variant", "exit_code", "result", "error")


# Task events defined in other domain modules (lending.py) and what each changes on the task.
TASK_FOLDS: dict[type[Payload], Callable[[Task, Any], dict[str, Any]]] = {}

# Lending state that only lasts while a task sleeps (libs/domain/task/lending.py): any status
# change out of `sleeping` ends it; a requeue also ends a borrower's loan.
SLEEP_ONLY: dict[str, Any] = {"sleep_released": False, "lent_to": "", "wake_queued": False}


def evolve_task(task: Task | None, event: Payload, at: datetime, version: int) -> Task:
    """The task after `event` (appended at `at` as `version` of its stream).

    Replay applies the same rules to plain documents (libs/store/replay_fold.py); a change
    here needs its twin there, and tests/unit/test_replay_fold.py fails until it has one.
    """
    if isinstance(event, TaskCreated):
        return Task(
            id=event.task_id,
            tenant_id=event.tenant_id,
            spec=event.spec,
            group_id=event.group_id,
            rank=event.rank,
            generation=event.generation,
            status_reason_code=ReasonCode.SUBMITTED,
            version=version,
            created_at=at,
            updated_at=at,
        )
    if task is None:
        raise ValueError(f"{event.type} before task_created")
    changes: dict[str, Any] = {"version": version, "updated_at": at}
    if isinstance(event, TaskStatusChanged):
        changes.update(_status_changes(task, event, at))
    elif isinstance(event, TaskConfigUpdated):
        changes["spec"] = task.spec.model_copy(update=_spec_update(event.changes))
    elif isinstance(event, TaskPendingReason):
        changes.update(pending_reason=event.reason, pending_reason_code=event.reason_code)
    elif isinstance(event, TaskDrainMarked):
        changes["draining"] = True
    elif isinstance(event, TaskRankMoved):
        changes["rank"] = event.to_rank
    elif isinstance(event, TaskDeleted):
        changes["deleted_at"] = at
    elif isinstance(event, TaskRetryDecided):
        # The verdict is kept on the task; a retry's status change follows with the new state.
        changes["retry"] = RetryVerdict(
            verdict=event.action,
            reason=event.reason,
            failure_class=event.failure_class,
            attempt=event.attempt,
            decided_at=at,
        )
    elif (fold := TASK_FOLDS.get(type(event))) is not None:
        changes.update(fold(task, event))
    else:
        raise ValueError(f"not a task event: {event.type}")
    return task.model_copy(update=changes)


def _spec_update(changes: dict[str, Any]) -> dict[str, Any]:
    # Re-validate through the model so nested values (volumes) get their types back.
    return {
        k: getattr(TaskSpec.model_validate({"name": "x", "image": "x", k: v}), k)
        for k, v in changes.items()
    }


def _status_changes(task: Task, ev: TaskStatusChanged, at: datetime) -> dict[str, Any]:
    # Any status change ends the previous wait: the scheduler says again why, if need be.
    out: dict[str, Any] = {
        "status": ev.to_status,
        "status_reason_code": ev.reason_code,
        "status_reason": ev.reason,
        "pending_reason": "",
        "pending_reason_code": None,
    }
    if ev.clear_placement:
        out.update(CLEARED_PLACEMENT)
    for name in CARRIED_FIELDS:
        value = getattr(ev, name)
        if value is not None:
            out[name] = value
    if ev.to_status is not TaskStatus.SLEEPING:
        out.update(SLEEP_ONLY)
    if ev.retry_count is not None:
        out["retry_count"] = ev.retry_count
    if ev.requeues is not None:
        out["requeues"] = ev.requeues
    if ev.memory_mb is not None:
        out["spec"] = task.spec.model_copy(update={"memory_mb": ev.memory_mb})
    if ev.to_status is TaskStatus.RUNNING and task.started_at is None:
        out["started_at"] = at
    if ev.to_status is TaskStatus.PENDING:
        # A fresh attempt: clear the previous attempt's outcome, keep history in the events.
        out.update(started_at=None, finished_at=None, exit_code=None, result="")
        out["borrowed_from"] = ""
        out.update(
            not_before=ev.not_before,
            same_node_id=ev.same_node_id or "",
            avoid_node_ids=ev.avoid_node_ids or (),
            min_vram_mb=ev.min_vram_mb or 0,
        )
        if ev.error is None:
            out["error"] = ""
    elif ev.to_status in (
        TaskStatus.COMPLETED,
        TaskStatus.FAILED,
        TaskStatus.CANCELLED,
        TaskStatus.STOPPED,
    ):
        out["finished_at"] = at
    return out
