"""Which task events wake the placer."""

from __future__ import annotations

from typing import Any

import pytest

from services.scheduler.placement import wakes_placement

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
