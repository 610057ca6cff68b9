"""What a schedule window asks of a group at a given instant (pure; the controller acts).

Outside the window the action applies once: the group's labels then record it (and the
replica count to restore), so the next evaluation, or a new controller after a restart,
sees it in force. Back inside, `pause` and `scale` are restored; `stop` is one-way.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from libs.domain.group.events import GroupWindowApplied
from libs.domain.group.model import Group
from libs.domain.group.windows import ACTION_LABEL, ORIGINAL_LABEL, WindowAction, in_window
from libs.domain.reasons import ReasonCode


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
    held = group.labels.get(ACTION_LABEL)
    if group.deleted_at is not None or (window is None and held is None):
        return None
    if window is None:
        # Removed by an update while its action held: undone as on re-entering the window;
        # a `stop` is not undone, but the group is released (the AutoScaler may act again).
        return _undo(group, str(held), "window removed")
    inside = in_window(window, now)
    if not inside and held is None:
        labels = dict(group.labels) | {
            ACTION_LABEL: window.action.value,
            ORIGINAL_LABEL: str(group.size),
        }
        replicas = window.scale_to if window.action is WindowAction.SCALE else None
        return _step(group, window.action.value, labels, replicas, "outside its window")
    if inside and held in (WindowAction.PAUSE, WindowAction.SCALE):
        return _undo(group, str(held), "back in its window")
    return None  # in force already, inside with nothing to undo, or stopped for good


def _undo(group: Group, held: str, why: str) -> WindowStep:
    labels = {k: v for k, v in group.labels.items() if k not in (ACTION_LABEL, ORIGINAL_LABEL)}
    if held == WindowAction.STOP:
        return _step(
            group, "release", labels, None, f"{why}: the stop stays, the group is released"
        )
    original = int(group.labels.get(ORIGINAL_LABEL, group.size))
    replicas = original if held == WindowAction.SCALE else None
    return _step(group, "restore", labels, replicas, f"{why}: {held} undone")


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
