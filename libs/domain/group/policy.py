"""Group events of the scaling policy: `auto_scale` and `schedule_window` changed through
`PUT /task-groups/{id}`, and the AutoScaler's decisions (docs/autoscaling.md).

Kept apart from group.py, which folds them (`evolve_group`), so that module stays the home
of the group's shape and status.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from libs.domain.group.autoscale import AutoScale, Decision, Inputs, Metric, Replica, Why
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


class GroupAutoscaleSampled(Payload):
    """What one AutoScaler pass decided on for a group: its settings, the metric value it
    read, the replicas and the rest of `Inputs`, so a policy replay can run the same decision
    again under other settings (docs/operations.md, "Policy replay"). Recorded when any of it
    differs from the last sample this leader recorded for the group, or with a decision that
    is recorded: a steady group's stream does not grow every pass."""

    type: ClassVar[str] = "group_autoscale_sampled"
    stream_type: ClassVar[str] = "group"

    group_id: str
    at: float  # the pass's clock, epoch seconds (the decision's `now`)
    interval_s: float  # the AutoScaler's evaluation period
    auto_scale: AutoScale
    value: float | None = None  # the per-replica metric value read (None: no sample)
    current: int
    born: tuple[float, ...] = ()  # each live replica's creation, epoch seconds, by rank
    draining: tuple[int, ...] = ()  # ranks of live replicas marked draining
    split: bool = False
    min_replica_age_s: float
    last_up_at: float | None = None
    last_scale_at: float | None = None
    suspended: bool = False
    gpu_per_replica: float = 0.0
    quota_left: float | None = None
    window_in_force: bool = False
    rollout_active: bool = False
    group_failed: bool = False

    def key(self) -> tuple[object, ...]:
        """Everything but the time: two passes with the same key decided on the same data."""
        return tuple(v for k, v in self.model_dump(mode="json").items() if k != "at")

    def inputs(self) -> Inputs:
        return Inputs(
            current=self.current,
            metric=self.value,
            now=self.at,
            last_up_at=self.last_up_at,
            last_scale_at=self.last_scale_at,
            suspended=self.suspended,
            gpu_per_replica=self.gpu_per_replica,
            quota_left=self.quota_left,
            window_in_force=self.window_in_force,
            rollout_active=self.rollout_active,
            group_failed=self.group_failed,
        )

    def replicas(self) -> list[Replica]:
        """The live replicas as `keep_safe` sees them at `at`."""
        return [
            Replica(
                task_id=str(rank),
                rank=rank,
                age_s=self.at - born,
                draining_for_s=0.0 if rank in self.draining else None,
            )
            for rank, born in enumerate(self.born)
        ]


def sampled(
    group_id: str,
    cfg: AutoScale,
    inp: Inputs,
    replicas: list[Replica],
    *,
    interval_s: float,
    split: bool,
    min_replica_age_s: float,
) -> GroupAutoscaleSampled:
    """The sample of one pass: `replicas` with their ages at `inp.now`."""
    ordered = sorted(replicas, key=lambda r: r.rank)
    return GroupAutoscaleSampled(
        group_id=group_id,
        at=inp.now,
        interval_s=interval_s,
        auto_scale=cfg,
        value=inp.metric,
        current=inp.current,
        born=tuple(round(inp.now - r.age_s, 3) for r in ordered),
        draining=tuple(r.rank for r in ordered if r.draining_for_s is not None),
        split=split,
        min_replica_age_s=min_replica_age_s,
        last_up_at=inp.last_up_at,
        last_scale_at=inp.last_scale_at,
        suspended=inp.suspended,
        gpu_per_replica=inp.gpu_per_replica,
        quota_left=inp.quota_left,
        window_in_force=inp.window_in_force,
        rollout_active=inp.rollout_active,
        group_failed=inp.group_failed,
    )


register(GroupScalingUpdated, GroupAutoscaleDecided, GroupAutoscaleSampled)


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
