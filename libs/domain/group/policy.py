"""Group events of the scaling policy: `auto_scale` and `schedule_window` changed through
`PUT /task-groups/{id}`, and the AutoScaler's decisions (docs/autoscaling.md).

Kept apart from group.py, which folds them (`evolve_group`), so that module stays the home
of the group's shape and status.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from libs.domain.group.autoscale import AutoScale, Decision, Metric, Why
from libs.domain.group.windows import ScheduleWindow
from libs.domain.payload import Payload, ReasonedPayload, register
from libs.domain.reasons import ReasonCode

POLICY_FIELDS = ("auto_scale", "schedule_window")


class GroupScalingUpdated(Payload):
    """`auto_scale` and/or `schedule_window` set (or removed: null) on a group."""

    type: ClassVar[str] = "group_scaling_updated"
    stream_type: ClassVar[str] = "group"

    group_id: str
    fields: tuple[str, ...]  # which of auto_scale, schedule_window this event sets
    auto_scale: AutoScale | None = None
    schedule_window: ScheduleWindow | None = None


class GroupAutoscaleDecided(ReasonedPayload):
    """One AutoScaler decision on a group, "no change" included (why: cooldown, quota, ...).
    A decision identical to the group's last recorded one is not recorded again."""

    type: ClassVar[str] = "group_autoscale_decided"
    stream_type: ClassVar[str] = "group"

    group_id: str
    why: Why
    metric: Metric
    value: float | None = None  # the per-replica metric value read (None: no sample)
    current: int
    computed: int
    replicas: int  # what the group is scaled to (== current: no change)

    def as_last(self, at: datetime) -> LastDecision:
        fields = ("why", "metric", "value", "current", "computed", "replicas")
        return LastDecision(at=at, **{f: getattr(self, f) for f in fields})


register(GroupScalingUpdated, GroupAutoscaleDecided)


class LastDecision(BaseModel):
    """The AutoScaler's last recorded decision, as the group shows it."""

    model_config = ConfigDict(frozen=True)

    why: Why
    metric: Metric
    value: float | None
    current: int
    computed: int
    replicas: int
    at: datetime

    def same(self, d: Decision) -> bool:
        return (self.why, self.current, self.computed, self.replicas) == (
            d.why,
            d.current,
            d.computed,
            d.replicas,
        )


def decided(
    group_id: str, metric: Metric, value: float | None, d: Decision
) -> GroupAutoscaleDecided:
    change = f"{d.current} → {d.replicas}" if d.changes else f"stays at {d.current}"
    shown = "no sample" if value is None else f"{value:g}"
    return GroupAutoscaleDecided(
        group_id=group_id,
        why=d.why,
        metric=metric,
        value=value,
        current=d.current,
        computed=d.computed,
        replicas=d.replicas,
        reason_code=ReasonCode.AUTOSCALE,
        reason=f"autoscale {d.why.value}: {metric.value}={shown}, computed {d.computed}, {change}",
    )
