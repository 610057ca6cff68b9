"""Which task events wake the placer: through the wake handler's own reading of the event
(a status change parsed into its model, every other event judged by its type)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.scheduler.handlers.wake import (
    PlacerWake,
    changes_holding,
    frees_a_start,
    status_change,
    wakes_placement,
)
from tests.envelopes import envelope


def change(before: str, after: str) -> dict[str, Any]:
    """A whole status-change payload, as the store writes it."""
    return {
        "task_id": "t",
        "from_status": before,
        "to_status": after,
        "actor": "scheduler",
        "reason_code": "placed",
    }


def judged(event_type: str, payload: dict[str, Any]) -> tuple[bool, bool, bool]:
    """(wakes, changes holding, frees a start) for one event, read as the handler reads it."""
    env = envelope(event_type, payload)
    ev = status_change(env)
    return (
        wakes_placement(env.type, ev),
        changes_holding(env.type, ev),
        frees_a_start(env.type, ev),
    )


WAKE_CASES: list[tuple[str, dict[str, Any], bool, str]] = [
    ("task_created", {}, True, "created"),
    ("task_status_changed", change("running", "pending"), True, "requeued"),
    ("task_status_changed", change("running", "completed"), True, "ended-frees-capacity"),
    ("task_status_changed", change("stopping", "stopped"), True, "stopped"),
    ("task_status_changed", change("pending", "scheduled"), False, "our-own-placement"),
    ("task_status_changed", change("scheduled", "starting"), False, "starting"),
    ("task_status_changed", change("starting", "running"), False, "running"),
    ("task_status_changed", change("running", "preempting"), False, "still-holding"),
    ("task_status_changed", {}, True, "unreadable-wakes"),
    ("task_status_changed", {"to_status": "scheduled"}, True, "partial-is-unreadable"),
    ("task_pending_reason", {"reason": "x"}, False, "our-own-why"),
    ("task_config_updated", {"changes": {}}, True, "config-may-change-fit"),
]


@pytest.mark.parametrize(
    ("event_type", "payload", "wakes"), [c[:3] for c in WAKE_CASES], ids=[c[3] for c in WAKE_CASES]
)
def test_wakes_placement(event_type: str, payload: dict[str, Any], wakes: bool) -> None:
    assert judged(event_type, payload)[0] is wakes


FREED_CASES: list[tuple[dict[str, Any], bool, str]] = [
    (change("starting", "running"), True, "started"),
    (change("scheduled", "running"), True, "started-directly"),
    (change("scheduled", "starting"), False, "still-in-flight"),
    (change("starting", "failed"), True, "start-failed"),
    (change("running", "completed"), False, "was-not-starting"),
    ({"to_status": "running"}, False, "no-from-status"),
]


@pytest.mark.parametrize(
    ("payload", "frees"), [c[:2] for c in FREED_CASES], ids=[c[2] for c in FREED_CASES]
)
def test_frees_a_start(payload: dict[str, Any], frees: bool) -> None:
    assert judged("task_status_changed", payload)[2] is frees
    assert not judged("task_pending_reason", payload)[2]


HOLDING_CASES: list[tuple[str, dict[str, Any], bool, str]] = [
    ("task_created", {}, False, "created-pending"),
    ("task_pending_reason", {"reason": "x"}, False, "our-own-why"),
    ("task_status_changed", change("pending", "scheduled"), False, "ours"),
    ("task_status_changed", change("starting", "running"), False, "same-cards"),
    ("task_status_changed", change("running", "completed"), True, "freed"),
    ("task_status_changed", change("running", "pending"), True, "requeued"),
    ("task_status_changed", change("stopping", "stopped"), True, "stopped"),
    ("task_status_changed", change("pending", "cancelled"), False, "held-none"),
    ("task_status_changed", {"to_status": "completed"}, True, "unreadable-relists"),
    ("task_config_updated", {"changes": {}}, True, "unknown-kind-relists"),
    ("task_deleted", {}, True, "deleted"),
]


@pytest.mark.parametrize(
    ("event_type", "payload", "changes"),
    [c[:3] for c in HOLDING_CASES],
    ids=[c[3] for c in HOLDING_CASES],
)
def test_changes_holding(event_type: str, payload: dict[str, Any], changes: bool) -> None:
    """Which task events make the placer's cluster view list the holding tasks again."""
    assert judged(event_type, payload)[1] is changes


class FakeView:
    def __init__(self) -> None:
        self.invalidated = 0

    def invalidate(self) -> None:
        self.invalidated += 1


class FakePlacer:
    def __init__(self, waiting_on_starts: bool) -> None:
        self.waiting_on_starts = waiting_on_starts
        self.cluster = FakeView()


@pytest.mark.parametrize(
    ("payload", "waiting", "woken", "relisted"),
    [
        (change("starting", "running"), False, False, 0),
        (change("starting", "running"), True, True, 1),
        (change("running", "completed"), False, True, 1),
        (change("pending", "scheduled"), True, False, 0),
    ],
    ids=["started-nobody-waits", "started-a-task-waits", "freed", "own-placement"],
)
async def test_the_handler_wakes_and_relists(
    payload: dict[str, Any], waiting: bool, woken: bool, relisted: int
) -> None:
    placer, wake = FakePlacer(waiting), asyncio.Event()
    handler = PlacerWake(placer, wake)  # type: ignore[arg-type]
    await handler.on_task_event(envelope("task_status_changed", payload))
    assert (wake.is_set(), placer.cluster.invalidated) == (woken, relisted)
