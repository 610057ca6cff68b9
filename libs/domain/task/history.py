"""Retry history of one task (GET /tasks/{id}/retries), folded from its event stream."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from libs.domain.payload import Payload
from libs.domain.task.events import TaskCreated, TaskRetryDecided, TaskStatusChanged
from libs.domain.task.states import TaskStatus

S = TaskStatus


@dataclass
class Attempt:
    attempt: int
    node_id: str | None
    status: str
    error: str | None
    memory_mb: int
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_code: int | None = None
    decision: str | None = None

    def view(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("started_at", "finished_at"):
            out[key] = out[key].isoformat() if out[key] else None
        return out


def retry_history(events: list[tuple[Payload, datetime]]) -> list[Attempt]:
    attempts: list[Attempt] = []
    for ev, at in events:
        if isinstance(ev, TaskCreated):
            attempts.append(Attempt(1, None, S.PENDING.value, None, ev.spec.memory_mb))
        elif isinstance(ev, TaskRetryDecided) and attempts:
            attempts[-1].decision = f"{ev.action}: {ev.reason}"
        elif isinstance(ev, TaskStatusChanged) and attempts:
            _apply(attempts, ev, at)
    return attempts


def _apply(attempts: list[Attempt], ev: TaskStatusChanged, at: datetime) -> None:
    cur = attempts[-1]
    if ev.to_status is S.PENDING and ev.from_status is S.FAILED:
        memory = ev.memory_mb or cur.memory_mb
        attempts.append(Attempt(len(attempts) + 1, None, S.PENDING.value, None, memory))
        return
    cur.status = ev.to_status.value
    if ev.node_id:
        cur.node_id = ev.node_id
    if ev.to_status is S.RUNNING and cur.started_at is None:
        cur.started_at = at
    if ev.to_status in (S.COMPLETED, S.FAILED, S.CANCELLED, S.STOPPED):
        cur.finished_at = at
        cur.exit_code = ev.exit_code
        cur.error = ev.error or None
