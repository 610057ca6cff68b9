"""What a schedule window asks of a group at a given instant (pure; the controller acts).

Outside the window the action applies once: the group's labels then record it (and the
replica count to restore), so the next evaluation, or a new controller after a restart,
sees it in force. Back inside, `pause` and `scale` are restored; `stop` is one-way.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .group import Group, GroupWindowApplied
from .reasons import ReasonCode
from .windows import ACTION_LABEL, ORIGINAL_LABEL, WindowAction, in_window


@dataclass(frozen=True)
class WindowStep:
    event: GroupWindowApplied
    action: str  # pause | scale | stop | restore
    replicas: int | None = None  # scale: the target; restore of a scale: the original


def window_in_force(group: Group) -> bool:
    """While a window action holds, the AutoScaler leaves the group alone."""
    return ACTION_LABEL in group.labels


def decide_window(group: Group, now: datetime) -> WindowStep | None:
    window = group.spec.schedule_window
    if window is None or group.deleted_at is not None:
        return None
    inside = in_window(window, now)
    held = group.labels.get(ACTION_LABEL)
    if not inside and held is None:
        labels = dict(group.labels) | {
            ACTION_LABEL: window.action.value,
            ORIGINAL_LABEL: str(group.size),
        }
        replicas = window.scale_to if window.action is WindowAction.SCALE else None
        return _step(group, window.action.value, labels, replicas, "outside its window")
    if inside and held in (WindowAction.PAUSE, WindowAction.SCALE):
        labels = {k: v for k, v in group.labels.items() if k not in (ACTION_LABEL, ORIGINAL_LABEL)}
        original = int(group.labels.get(ORIGINAL_LABEL, group.size))
        replicas = original if held == WindowAction.SCALE else None
        return _step(group, "restore", labels, replicas, f"back in its window: {held} undone")
    return None  # in force already, inside with nothing to undo, or stopped for good


def _step(
    group: Group, action: str, labels: dict[str, str], replicas: int | None, why: str
) -> WindowStep:
    event = GroupWindowApplied(
        group_id=group.id,
        action=action,
        labels=labels,
        reason_code=ReasonCode.SCHEDULE_WINDOW,
        reason=f"schedule window: {action} ({why})",
    )
    return WindowStep(event, action, replicas)
