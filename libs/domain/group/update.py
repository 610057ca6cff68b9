"""`PUT /task-groups/{id}`: what a group update may change, validated, as group events.

Updatable at any time: `idle_timeout_minutes` (also passed on to the live members),
`auto_scale` and `schedule_window` (null removes either). Every problem is refused with the
codes of SPEC §2 naming the field: unknown fields 40001, fields fixed at creation 40020, bad
values 40003. Nothing is written unless the whole body is valid.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from libs.domain.errors import Code, DomainError
from libs.domain.group.autoscale import AutoScale
from libs.domain.group.events import GroupConfigUpdated
from libs.domain.group.model import GROUP_FIELDS, POLICY_KEYS, Group, parse_group_auto_scale
from libs.domain.group.policy import GroupScalingUpdated
from libs.domain.group.windows import ScheduleWindow, parse_window
from libs.domain.payload import Payload
from libs.domain.task.model import CREATE_FIELDS
from libs.domain.validation import INT_FIELD_MAX, is_integer

UPDATABLE = frozenset({"idle_timeout_minutes"}) | POLICY_KEYS
KNOWN = CREATE_FIELDS | GROUP_FIELDS | POLICY_KEYS | {"group_id", "rank"}


def parse_group_update(group: Group, body: Any) -> tuple[list[Payload], dict[str, Any]]:
    """The events of a valid update, and the config changes its live members take."""
    if not isinstance(body, Mapping):
        raise DomainError(Code.INVALID_VALUE, "request body must be a JSON object", ["body"])
    unknown = sorted(set(body) - KNOWN)
    if unknown:
        raise DomainError(Code.UNKNOWN_FIELD, f"unknown field(s): {', '.join(unknown)}", unknown)
    fixed = sorted(set(body) - UPDATABLE)
    if fixed:
        raise DomainError(
            Code.NOT_PENDING,
            f"a task group accepts only {', '.join(sorted(UPDATABLE))} as an update; "
            f"refused: {', '.join(fixed)}",
            fixed,
        )
    if not body:
        raise DomainError(
            Code.INVALID_VALUE,
            f"nothing to update: give one of {', '.join(sorted(UPDATABLE))}",
            sorted(UPDATABLE),
        )
    events: list[Payload] = []
    changes: dict[str, Any] = {}
    if "idle_timeout_minutes" in body:
        value = body["idle_timeout_minutes"]
        if not is_integer(value) or not 0 <= value <= INT_FIELD_MAX:
            raise DomainError(
                Code.INVALID_VALUE,
                f"idle_timeout_minutes must be an integer >= 0 (at most {INT_FIELD_MAX})",
                ["idle_timeout_minutes"],
            )
        changes = {"idle_timeout_minutes": value}
    policy = sorted(k for k in body if k in POLICY_KEYS)
    auto_scale: AutoScale | None = None
    window: ScheduleWindow | None = None
    if body.get("auto_scale") is not None:
        auto_scale = parse_group_auto_scale(body["auto_scale"], group.spec)
    if body.get("schedule_window") is not None:
        window = parse_window(body["schedule_window"], static_world=group.spec.static_world)
    if changes:
        events.append(GroupConfigUpdated(group_id=group.id, changes=changes))
    if policy:
        events.append(
            GroupScalingUpdated(
                group_id=group.id,
                fields=tuple(policy),
                auto_scale=auto_scale,
                schedule_window=window,
            )
        )
    return events, changes
