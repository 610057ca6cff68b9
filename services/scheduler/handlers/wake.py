"""Task and node events that wake the placer early (core subscriptions, every replica).

A task event may add pending work or free capacity: it wakes the placement controller, and
where it changes what is held in a way the leader's own commits did not teach its cluster
view, it makes the view list the holding tasks again. Only a status change's payload is read,
as its model (`TaskStatusChanged`); every other task event is judged by its type. A status
change whose payload does not parse counts as unreadable: it wakes and relists.
"""

from __future__ import annotations

import asyncio

from pydantic import ValidationError

from libs.domain.envelope import EventEnvelope
from libs.domain.task.events import TaskStatusChanged
from libs.domain.task.states import GPU_HOLDING, TaskStatus

from ..controllers.placement import Placer

# Task events that leave what is held as the leader's own commits made it.
_HOLDING_UNCHANGED = frozenset({"task_created", "task_pending_reason", "task_retry_decided"})
_IN_FLIGHT = frozenset({TaskStatus.SCHEDULED, TaskStatus.STARTING})
STATUS_CHANGED = TaskStatusChanged.type


def status_change(envelope: EventEnvelope) -> TaskStatusChanged | None:
    """A status change's payload as its model; None for another event or an unreadable one."""
    if envelope.type != STATUS_CHANGED:
        return None
    try:
        return TaskStatusChanged.model_validate(envelope.payload)
    except ValidationError:
        return None


def wakes_placement(event_type: str, change: TaskStatusChanged | None) -> bool:
    """Whether a task event can change what a round would do.

    A move into a GPU-holding status (scheduled, starting, running, ...) neither adds pending
    work nor frees capacity, and the reason a task is pending is our own write; everything
    else (a task created, back to pending, ended, changed) wakes the placer. The idle poll
    of the placement controller covers the rest.
    """
    if event_type == "task_pending_reason":
        return False
    if event_type == STATUS_CHANGED and change is not None:
        return change.to_status not in GPU_HOLDING
    return True


def changes_holding(event_type: str, change: TaskStatusChanged | None) -> bool:
    """Whether a task event can change the GPU-holding set in a way the leader's cluster view
    did not learn from its own commits: a task leaving a holding status (capacity freed),
    or any change the view does not know how to read (config, drain, deletion, an unreadable
    status change). Moves into `scheduled` are the leader's own placements; moves between
    holding statuses keep their cards (a node's in-flight starts are covered by
    `frees_a_start`)."""
    if event_type in _HOLDING_UNCHANGED:
        return False
    if event_type == STATUS_CHANGED and change is not None:
        return change.from_status in GPU_HOLDING and change.to_status not in GPU_HOLDING
    return True


def frees_a_start(event_type: str, change: TaskStatusChanged | None) -> bool:
    """Whether a task event ends one of its node's in-flight starts: out of scheduled or
    starting into a status that is not. `wakes_placement` already covers the moves out of
    the GPU-holding set; this one matters only while a task waits on STARTS_IN_FLIGHT."""
    return (
        event_type == STATUS_CHANGED
        and change is not None
        and change.from_status in _IN_FLIGHT
        and change.to_status not in _IN_FLIGHT
    )


class PlacerWake:
    """The two wake subscriptions' handlers, over the placer's cluster view and wake-up."""

    def __init__(self, placer: Placer, wake: asyncio.Event) -> None:
        self.placer = placer
        self.wake = wake

    async def on_task_event(self, envelope: EventEnvelope) -> None:
        kind, change = envelope.type, status_change(envelope)
        starts_freed = self.placer.waiting_on_starts and frees_a_start(kind, change)
        if starts_freed or changes_holding(kind, change):
            self.placer.cluster.invalidate()
        if starts_freed or wakes_placement(kind, change):
            self.wake.set()

    async def on_node_event(self, _envelope: EventEnvelope) -> None:
        self.placer.cluster.invalidate()
        self.wake.set()
