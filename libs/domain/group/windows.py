"""Schedule windows (SPEC §5): when a group runs normally, and what happens outside.

`schedule_window: {start, end, timezone, days?, action, scale_to?}`. The window is the
time a group runs as created; outside it `action` applies: `pause` sleeps the members,
`scale` scales to `scale_to`, `stop` stops the group (one-way). Pure functions: the
controller passes the time in, so tests can cross midnight without waiting.

A window that ends before it starts (22:00–06:00) crosses midnight; `days` name the days
on which the window opens, so Friday 22:00–06:00 covers Saturday 03:00. `start == end`
means the whole day.
"""

from __future__ import annotations

from datetime import datetime, time, timedelta
from enum import StrEnum
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from libs.domain.errors import Code, DomainError
from libs.domain.validation import exactly_int

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
ORIGINAL_LABEL = "heteroflow.window.original_replicas"
ACTION_LABEL = "heteroflow.window.action"


class WindowAction(StrEnum):
    PAUSE = "pause"
    SCALE = "scale"
    STOP = "stop"


class ScheduleWindow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    start: str
    end: str
    timezone: str = "UTC"
    days: tuple[str, ...] = DAYS
    action: WindowAction
    scale_to: int | None = Field(default=None, ge=0, le=1024)

    _scale_to = field_validator("scale_to", mode="before")(exactly_int)

    @field_validator("start", "end")
    @classmethod
    def _hhmm(cls, value: str) -> str:
        hh, sep, mm = value.partition(":")
        if not (sep and len(hh) == 2 and len(mm) == 2 and hh.isdigit() and mm.isdigit()):
            raise ValueError("must be HH:MM")
        if int(hh) > 23 or int(mm) > 59:
            raise ValueError("must be HH:MM between 00:00 and 23:59")
        return value

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown timezone {value!r}") from None
        return value

    @field_validator("days")
    @classmethod
    def _days(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [d for d in value if d not in DAYS]
        if bad or not value:
            raise ValueError(f"days must be a non-empty list of {', '.join(DAYS)}")
        return tuple(d for d in DAYS if d in value)

    def opens(self) -> time:
        return time.fromisoformat(self.start)

    def closes(self) -> time:
        return time.fromisoformat(self.end)


def parse_window(raw: Any, *, static_world: bool) -> ScheduleWindow:
    """Validate a `schedule_window` body; every problem is a 40003 naming its field."""
    if not isinstance(raw, dict):
        raise DomainError(
            Code.INVALID_VALUE, "schedule_window must be an object", ["schedule_window"]
        )
    try:
        window = ScheduleWindow.model_validate(raw)
    except ValidationError as exc:
        fields = ["schedule_window." + ".".join(str(p) for p in e["loc"]) for e in exc.errors()]
        msg = "; ".join(
            f"{field}: {str(e['msg']).removeprefix('Value error, ')}"
            for field, e in zip(fields, exc.errors(), strict=True)
        )
        code = (
            Code.UNKNOWN_FIELD
            if exc.errors()[0]["type"] == "extra_forbidden"
            else Code.INVALID_VALUE
        )
        raise DomainError(code, f"invalid {msg}", fields) from None
    if window.action is WindowAction.SCALE and window.scale_to is None:
        raise DomainError(
            Code.INVALID_VALUE, "action scale needs scale_to", ["schedule_window.scale_to"]
        )
    if window.action is not WindowAction.SCALE and window.scale_to is not None:
        raise DomainError(
            Code.INVALID_VALUE,
            f"scale_to applies only to action scale, not {window.action.value}",
            ["schedule_window.scale_to"],
        )
    if static_world and window.action is WindowAction.SCALE and (window.scale_to or 0) > 0:
        raise DomainError(
            Code.INVALID_VALUE,
            "a static-world group cannot run at another size: use scale_to 0, pause or stop",
            ["schedule_window.scale_to"],
        )
    return window


def in_window(window: ScheduleWindow, now: datetime) -> bool:
    """Whether `now` (aware) lies inside the window, in the window's timezone."""
    local = now.astimezone(ZoneInfo(window.timezone))
    t, start, end = local.time(), window.opens(), window.closes()
    today = DAYS[local.weekday()]
    yesterday = DAYS[(local - timedelta(days=1)).weekday()]
    if start == end:
        return today in window.days
    if start < end:
        return today in window.days and start <= t < end
    # crosses midnight: the evening part opens today, the morning part opened yesterday
    return (t >= start and today in window.days) or (t < end and yesterday in window.days)
