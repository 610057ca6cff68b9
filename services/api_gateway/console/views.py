"""What the group and pool pages compute from the API's answers (pure): a schedule window's
state and next change, the serving figures a page has sampled, a pool's usage.

The serving endpoint answers the figures of now; the console keeps the last few answers of
each group it was asked to show (`FigureLog`, one per gateway process, bounded), so the group
page can draw how they moved while someone watched.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from libs.domain.group.windows import ScheduleWindow, in_window

SAMPLES = 60  # per group
GROUPS_KEPT = 256  # groups whose samples are kept, least recently shown dropped first


def window_state(raw: dict[str, Any] | None, now: datetime) -> dict[str, Any] | None:
    """`{"open", "next_change"}` for a group's `schedule_window` at `now`."""
    if not raw:
        return None
    window = ScheduleWindow.model_validate(raw)
    is_open = in_window(window, now)
    change = next_change(window, now, is_open)
    return {
        "open": is_open,
        "next_change": change.isoformat(timespec="minutes") if change else None,
    }


def next_change(window: ScheduleWindow, now: datetime, is_open: bool) -> datetime | None:
    """The first window boundary after `now` at which the state flips (None: it never does,
    as for an all-day window on every day)."""
    zone = ZoneInfo(window.timezone)
    today = now.astimezone(zone).date()
    candidates = sorted(
        datetime.combine(today + timedelta(days=d), t, zone)
        for d in range(9)
        for t in {window.opens(), window.closes()}
    )
    for at in candidates:
        if at > now and in_window(window, at) != is_open:
            return at
    return None


class FigureLog:
    """The last `SAMPLES` serving answers of each group shown, oldest first."""

    def __init__(self) -> None:
        self._groups: OrderedDict[str, deque[dict[str, float]]] = OrderedDict()

    def add(self, group_id: str, serving: dict[str, Any]) -> list[dict[str, float]]:
        """Record one answer of `GET /task-groups/{id}/serving`; the samples so far."""
        replicas = serving.get("replicas", [])
        sample = {
            "rps": float(serving.get("requests_per_second", 0.0)),
            "p95": float(serving.get("latency_p95_ms", 0.0)),
            "ready": float(sum(1 for r in replicas if r.get("ready"))),
            "total": float(len(replicas)),
        }
        samples = self._groups.pop(group_id, None) or deque(maxlen=SAMPLES)
        samples.append(sample)
        self._groups[group_id] = samples
        while len(self._groups) > GROUPS_KEPT:
            self._groups.popitem(last=False)
        return list(samples)


def pool_usage(capacity: dict[str, int]) -> dict[str, tuple[int, int]]:
    """(used, total) of a pool's cards, memory and online nodes, from its `capacity`."""
    return {
        "gpus": (capacity["total_gpus"] - capacity["free_gpus"], capacity["total_gpus"]),
        "memory_mb": (
            capacity["total_memory_mb"] - capacity["free_memory_mb"],
            capacity["total_memory_mb"],
        ),
        "nodes": (capacity["online_nodes"], capacity["nodes"]),
    }
