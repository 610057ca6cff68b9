"""Schedule-window membership and validation: no servers, time passed in."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from libs.domain.errors import DomainError
from libs.domain.group.evolve import evolve_group
from libs.domain.group.model import Group, parse_group
from libs.domain.group.window_control import decide_window, window_in_force
from libs.domain.group.windows import ORIGINAL_LABEL, ScheduleWindow, in_window, parse_window
from libs.domain.task.model import TenantId

# 2026-01-05 is a Monday.
MON = 5


def at(day: int, hh: int, mm: int = 0) -> datetime:
    return datetime(2026, 1, day, hh, mm, tzinfo=UTC)


def window(**kw: Any) -> ScheduleWindow:
    return parse_window(
        {"start": "09:00", "end": "17:00", "action": "pause"} | kw, static_world=False
    )


NY_EVENING = {"timezone": "America/New_York", "start": "19:00", "end": "21:00"}

MEMBERSHIP = [
    # id, window fields, instant, inside
    ("day: before start", {}, at(MON, 8, 59), False),
    ("day: at start", {}, at(MON, 9, 0), True),
    ("day: just before end", {}, at(MON, 16, 59), True),
    ("day: at end", {}, at(MON, 17, 0), False),
    ("night: evening part", {"start": "22:00", "end": "06:00"}, at(MON, 23, 0), True),
    ("night: morning part", {"start": "22:00", "end": "06:00"}, at(MON + 1, 5, 59), True),
    ("night: after end", {"start": "22:00", "end": "06:00"}, at(MON + 1, 6, 0), False),
    ("night: midday", {"start": "22:00", "end": "06:00"}, at(MON, 12, 0), False),
    ("night: at midnight", {"start": "22:00", "end": "06:00"}, at(MON + 1, 0, 0), True),
    ("weekdays: friday", {"days": ["mon", "tue", "wed", "thu", "fri"]}, at(MON + 4, 10), True),
    ("weekdays: saturday", {"days": ["mon", "tue", "wed", "thu", "fri"]}, at(MON + 5, 10), False),
    (
        "friday night reaches saturday morning",
        {"start": "22:00", "end": "06:00", "days": ["fri"]},
        at(MON + 5, 3),
        True,
    ),
    (
        "saturday night is not opened",
        {"start": "22:00", "end": "06:00", "days": ["fri"]},
        at(MON + 5, 23),
        False,
    ),
    (
        "sunday night into monday",
        {"start": "22:00", "end": "06:00", "days": ["sun"]},
        at(MON, 1),
        True,
    ),
    ("whole day", {"start": "00:00", "end": "00:00", "days": ["mon"]}, at(MON, 23, 59), True),
    (
        "whole day, other day",
        {"start": "00:00", "end": "00:00", "days": ["mon"]},
        at(MON + 1, 0),
        False,
    ),
    # 09:00-17:00 in Tokyo (UTC+9) is 00:00-08:00 UTC
    ("timezone: inside", {"timezone": "Asia/Tokyo"}, at(MON, 1), True),
    ("timezone: outside", {"timezone": "Asia/Tokyo"}, at(MON, 10), False),
    # Tuesday 01:00 UTC is Monday 20:00 in New York; Monday 01:00 UTC is Sunday there
    ("timezone keeps its own day", {**NY_EVENING, "days": ["mon"]}, at(MON + 1, 1), True),
    ("timezone: still sunday there", {**NY_EVENING, "days": ["mon"]}, at(MON, 1), False),
]


@pytest.mark.parametrize(
    ("fields", "now", "inside"), [c[1:] for c in MEMBERSHIP], ids=[c[0] for c in MEMBERSHIP]
)
def test_membership(fields: dict[str, Any], now: datetime, inside: bool) -> None:
    assert in_window(window(**fields), now) is inside


REFUSED = [
    ("bad time", {"start": "9:00"}, False, 40003, "schedule_window.start"),
    ("hour 24", {"end": "24:00"}, False, 40003, "schedule_window.end"),
    ("bad zone", {"timezone": "Mars/Base"}, False, 40003, "schedule_window.timezone"),
    ("bad day", {"days": ["funday"]}, False, 40003, "schedule_window.days"),
    ("no days", {"days": []}, False, 40003, "schedule_window.days"),
    ("bad action", {"action": "sleep"}, False, 40003, "schedule_window.action"),
    ("scale without scale_to", {"action": "scale"}, False, 40003, "schedule_window.scale_to"),
    ("scale_to with pause", {"scale_to": 2}, False, 40003, "schedule_window.scale_to"),
    ("unknown field", {"every": "day"}, False, 40001, "schedule_window.every"),
    (
        "static world scale above 0",
        {"action": "scale", "scale_to": 1},
        True,
        40003,
        "schedule_window.scale_to",
    ),
]


@pytest.mark.parametrize(
    ("fields", "static", "code", "field"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_refused(fields: dict[str, Any], static: bool, code: int, field: str) -> None:
    raw = {"start": "09:00", "end": "17:00", "action": "pause"} | fields
    with pytest.raises(DomainError) as err:
        parse_window(raw, static_world=static)
    assert err.value.code == code and field in (err.value.fields or []), err.value.message


@pytest.mark.parametrize(
    "fields",
    [{"action": "scale", "scale_to": 0}, {"action": "stop"}, {"action": "pause"}],
    ids=["scale to 0", "stop", "pause"],
)
def test_static_world_accepts(fields: dict[str, Any]) -> None:
    parse_window({"start": "09:00", "end": "17:00"} | fields, static_world=True)


def test_days_are_normalised() -> None:
    assert window(days=["sun", "mon"]).days == ("mon", "sun")


# --- decisions over time: a test clock walks the group through midnight -----------------


def night_group(action: dict[str, Any], size: int = 3) -> Group:
    raw = {"name": "g", "image": "x", "task_count": size}
    raw["schedule_window"] = {"start": "22:00", "end": "06:00"} | action
    return Group(
        id="g",
        tenant_id=TenantId("a"),
        spec=parse_group(raw, tenant=True),
        created_at=at(MON, 0),
        updated_at=at(MON, 0),
    )


WALKS = [
    # id, action, [(instant, expected step action or None, replicas)]
    (
        "scale to 0 and back",
        {"action": "scale", "scale_to": 0},
        [
            (at(MON, 23), None, None),
            (at(MON + 1, 6), "scale", 0),
            (at(MON + 1, 12), None, None),
            (at(MON + 1, 22), "restore", 3),
            (at(MON + 2, 1), None, None),
        ],
    ),
    (
        "pause then wake",
        {"action": "pause"},
        [
            (at(MON, 12), "pause", None),
            (at(MON, 21, 59), None, None),
            (at(MON, 22), "restore", None),
        ],
    ),
    (
        "stop is one-way",
        {"action": "stop"},
        [(at(MON, 12), "stop", None), (at(MON, 22), None, None), (at(MON + 1, 12), None, None)],
    ),
]


@pytest.mark.parametrize(("action", "walk"), [c[1:] for c in WALKS], ids=[c[0] for c in WALKS])
def test_window_walk(
    action: dict[str, Any], walk: list[tuple[datetime, str | None, int | None]]
) -> None:
    group = night_group(action)
    version = 1
    for now, expected, replicas in walk:
        step = decide_window(group, now)
        assert (step.action if step else None) == expected, now
        if step is None:
            continue
        assert step.replicas == replicas
        assert window_in_force(evolve_group(group, step.event, now, version + 1)) is (
            expected != "restore"
        )
        version += 1
        group = evolve_group(group, step.event, now, version)
        if step.replicas is not None and step.action == "scale":
            group = group.model_copy(update={"replicas": step.replicas})


def test_original_count_survives_in_the_labels() -> None:
    """A new controller reads the count to restore from the group, not from memory."""
    group = night_group({"action": "scale", "scale_to": 1}, size=5)
    step = decide_window(group, at(MON, 12))
    assert step is not None and step.event.labels[ORIGINAL_LABEL] == "5"
    stored = evolve_group(group, step.event, at(MON, 12), 2).model_copy(update={"replicas": 1})
    reloaded = Group.model_validate_json(stored.model_dump_json())
    back = decide_window(reloaded, at(MON, 23))
    assert back is not None and back.action == "restore" and back.replicas == 5


def test_group_without_window_is_left_alone() -> None:
    g = night_group({"action": "pause"}).model_copy(
        update={
            "spec": night_group({"action": "pause"}).spec.model_copy(
                update={"schedule_window": None}
            )
        }
    )
    assert decide_window(g, at(MON, 12)) is None


REMOVED = [
    # id, action, step on removal, replicas to restore, in force after
    ("scale: restored", {"action": "scale", "scale_to": 0}, "restore", 3),
    ("pause: woken", {"action": "pause"}, "restore", None),
    ("stop: released, not restarted", {"action": "stop"}, "release", None),
]


@pytest.mark.parametrize(
    ("action", "expected", "replicas"), [c[1:] for c in REMOVED], ids=[c[0] for c in REMOVED]
)
def test_removing_the_window_while_its_action_holds(
    action: dict[str, Any], expected: str, replicas: int | None
) -> None:
    group = night_group(action)
    step = decide_window(group, at(MON, 12))
    assert step is not None
    held = evolve_group(group, step.event, at(MON, 12), 2)
    removed = held.model_copy(
        update={"spec": held.spec.model_copy(update={"schedule_window": None})}
    )
    undo = decide_window(removed, at(MON, 13))
    assert undo is not None and (undo.action, undo.replicas) == (expected, replicas)
    after = evolve_group(removed, undo.event, at(MON, 13), 3)
    assert not window_in_force(after) and after.labels == {}
    assert decide_window(after, at(MON, 14)) is None
