"""Which task events wake the placer."""

from __future__ import annotations

from typing import Any

import pytest

from services.scheduler.placement import changes_holding, frees_a_start, wakes_placement

WAKE_CASES: list[tuple[str, dict[str, Any], bool, str]] = [
    ("task_created", {}, True, "created"),
    ("task_status_changed", {"to_status": "pending"}, True, "requeued"),
    ("task_status_changed", {"to_status": "completed"}, True, "ended-frees-capacity"),
    ("task_status_changed", {"to_status": "stopped"}, True, "stopped"),
    ("task_status_changed", {"to_status": "scheduled"}, False, "our-own-placement"),
    ("task_status_changed", {"to_status": "starting"}, False, "starting"),
    ("task_status_changed", {"to_status": "running"}, False, "running"),
    ("task_status_changed", {"to_status": "preempting"}, False, "still-holding"),
    ("task_status_changed", {}, True, "unreadable-wakes"),
    ("task_pending_reason", {"reason": "x"}, False, "our-own-why"),
    ("task_config_updated", {"changes": {}}, True, "config-may-change-fit"),
]


@pytest.mark.parametrize(
    ("event_type", "payload", "wakes"), [c[:3] for c in WAKE_CASES], ids=[c[3] for c in WAKE_CASES]
)
def test_wakes_placement(event_type: str, payload: dict[str, Any], wakes: bool) -> None:
    assert wakes_placement(event_type, payload) is wakes


FREED_CASES: list[tuple[dict[str, Any], bool, str]] = [
    ({"from_status": "starting", "to_status": "running"}, True, "started"),
    ({"from_status": "scheduled", "to_status": "running"}, True, "started-directly"),
    ({"from_status": "scheduled", "to_status": "starting"}, False, "still-in-flight"),
    ({"from_status": "starting", "to_status": "failed"}, True, "start-failed"),
    ({"from_status": "running", "to_status": "completed"}, False, "was-not-starting"),
    ({"to_status": "running"}, False, "no-from-status"),
]


@pytest.mark.parametrize(
    ("payload", "frees"), [c[:2] for c in FREED_CASES], ids=[c[2] for c in FREED_CASES]
)
def test_frees_a_start(payload: dict[str, Any], frees: bool) -> None:
    assert frees_a_start("task_status_changed", payload) is frees
    assert not frees_a_start("task_pending_reason", payload)


HOLDING_CASES: list[tuple[str, dict[str, Any], bool, str]] = [
    ("task_created", {}, False, "created-pending"),
    ("task_pending_reason", {"reason": "x"}, False, "our-own-why"),
    ("task_status_changed", {"from_status": "pending", "to_status": "scheduled"}, False, "ours"),
    (
        "task_status_changed",
        {"from_status": "starting", "to_status": "running"},
        False,
        "same-cards",
    ),
    ("task_status_changed", {"from_status": "running", "to_status": "completed"}, True, "freed"),
    ("task_status_changed", {"from_status": "running", "to_status": "pending"}, True, "requeued"),
    ("task_status_changed", {"from_status": "stopping", "to_status": "stopped"}, True, "stopped"),
    (
        "task_status_changed",
        {"from_status": "pending", "to_status": "cancelled"},
        False,
        "held-none",
    ),
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
    assert changes_holding(event_type, payload) is changes
