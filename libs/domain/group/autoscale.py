"""The AutoScaler's decisions (SPEC §5, seed 000 自动伸缩), pure: numbers in, a decision out.

`auto_scale: {metric, target, min_replicas, max_replicas, cooldown_up_s, cooldown_down_s}`.
Target replicas = ceil(current × metric / target), clamped to [min, max]. Every outcome,
"no change" included, carries a reason code a program can read (the AutoScaler service,
services/autoscaler/controllers/scaler.py, records each decision as an event).

The router's figures are totals per target; `metric_value` turns them into the per-replica
value the formula expects, so a `qps` target of 50 asks for one replica per 50 requests/s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from libs.domain.errors import Code, DomainError
from libs.domain.group.serving import ServingMetrics

MIN_REPLICA_AGE_S = 60.0  # never remove a replica younger than this
DRAIN_LIMIT_S = 120.0  # a replica draining longer than this is ended


class Metric(StrEnum):
    GPU_UTILIZATION = "gpu_utilization"
    QPS = "qps"
    CONCURRENCY = "concurrency"
    LATENCY_P95_MS = "latency_p95_ms"
    QUEUE_DEPTH = "queue_depth"


class AutoScale(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    metric: Metric
    target: float = Field(gt=0)
    min_replicas: int = Field(default=1, ge=0, le=1024)
    max_replicas: int = Field(ge=1, le=1024)
    cooldown_up_s: float = Field(default=60.0, ge=0)
    cooldown_down_s: float = Field(default=300.0, ge=0)

    @model_validator(mode="after")
    def _bounds(self) -> AutoScale:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must not exceed max_replicas")
        return self


def parse_auto_scale(raw: Any) -> AutoScale:
    if not isinstance(raw, dict):
        raise DomainError(Code.INVALID_VALUE, "auto_scale must be an object", ["auto_scale"])
    try:
        return AutoScale.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        fields = [
            "auto_scale." + ".".join(str(p) for p in e["loc"]) if e["loc"] else "auto_scale"
            for e in errors
        ]
        msg = "; ".join(
            f"{f}: {str(e['msg']).removeprefix('Value error, ')}"
            for f, e in zip(fields, errors, strict=True)
        )
        code = Code.UNKNOWN_FIELD if errors[0]["type"] == "extra_forbidden" else Code.INVALID_VALUE
        raise DomainError(code, f"invalid {msg}", fields) from None


class Why(StrEnum):
    """Why the AutoScaler did (or did not) change a group."""

    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    SCALE_FROM_ZERO = "scale_from_zero"
    QUOTA_CAPPED = "quota_capped"  # scaled up, but by fewer than computed
    AT_TARGET = "at_target"
    NO_METRIC = "no_metric"
    COOLDOWN_UP = "cooldown_up"
    COOLDOWN_DOWN = "cooldown_down"
    QUOTA_EXHAUSTED = "quota_exhausted"
    TENANT_SUSPENDED = "tenant_suspended"
    SCHEDULE_WINDOW = "schedule_window"
    ROLLOUT = "rollout"  # a rolling update holds the group: its controller owns the replicas
    GROUP_FAILED = "group_failed"  # failed for good (crash loop, rebuilds used): not revived
    YOUNG_REPLICAS = "young_replicas"  # the scale-down would remove a replica younger than 60 s


@dataclass(frozen=True)
class Inputs:
    current: int  # live replicas
    metric: float | None  # None: no sample yet
    now: float  # seconds, the controller's clock
    last_up_at: float | None = None
    last_scale_at: float | None = None  # up or down
    suspended: bool = False
    gpu_per_replica: float = 0.0
    quota_left: float | None = None  # GPUs the tenant may still take; None = unlimited
    window_in_force: bool = False
    rollout_active: bool = False
    group_failed: bool = False


@dataclass(frozen=True)
class Decision:
    why: Why
    current: int
    computed: int  # what the formula (and clamps) asked for
    replicas: int  # what to scale to (== current: no change)

    @property
    def changes(self) -> bool:
        return self.replicas != self.current


def computed_replicas(cfg: AutoScale, current: int, metric: float) -> int:
    """ceil(current × metric / target), clamped to [min_replicas, max_replicas]."""
    raw = math.ceil(current * metric / cfg.target - 1e-9)  # 2 × 50/50 is 2, not 3
    return max(cfg.min_replicas, min(cfg.max_replicas, raw))


def decide_autoscale(cfg: AutoScale, inp: Inputs) -> Decision:
    def keep(why: Why, computed: int | None = None) -> Decision:
        return Decision(
            why, inp.current, inp.current if computed is None else computed, inp.current
        )

    if inp.window_in_force:
        return keep(Why.SCHEDULE_WINDOW)
    if inp.rollout_active:
        return keep(Why.ROLLOUT)
    if inp.current == 0:
        if inp.group_failed:
            return keep(Why.GROUP_FAILED)
        if cfg.min_replicas == 0:
            return keep(Why.AT_TARGET, 0)
        computed, up_why = cfg.min_replicas, Why.SCALE_FROM_ZERO
    elif inp.metric is None:
        return keep(Why.NO_METRIC)
    else:
        computed, up_why = computed_replicas(cfg, inp.current, inp.metric), Why.SCALE_UP
    if computed < inp.current:
        if inp.last_scale_at is not None and inp.now - inp.last_scale_at < cfg.cooldown_down_s:
            return keep(Why.COOLDOWN_DOWN, computed)
        return Decision(Why.SCALE_DOWN, inp.current, computed, computed)
    if computed == inp.current:
        return keep(Why.AT_TARGET, computed)
    if inp.suspended:
        return keep(Why.TENANT_SUSPENDED, computed)
    if inp.last_up_at is not None and inp.now - inp.last_up_at < cfg.cooldown_up_s:
        return keep(Why.COOLDOWN_UP, computed)
    replicas = computed
    if inp.quota_left is not None and inp.gpu_per_replica > 0:
        fit = math.floor(inp.quota_left / inp.gpu_per_replica + 1e-9)
        if fit <= 0:
            return keep(Why.QUOTA_EXHAUSTED, computed)
        if inp.current + fit < computed:
            return Decision(Why.QUOTA_CAPPED, inp.current, computed, inp.current + fit)
    return Decision(up_why, inp.current, computed, replicas)


@dataclass(frozen=True)
class Replica:
    task_id: str
    rank: int
    age_s: float  # since the replica's task was created
    connections: int = 0
    draining_for_s: float | None = None


def choose_removals(
    replicas: Sequence[Replica], count: int, *, split: bool, min_age_s: float = MIN_REPLICA_AGE_S
) -> list[str]:
    """Which replicas a scale-down of `count` removes. Never one younger than `min_age_s`;
    outside `split` never rank 0 (workers only, highest rank first); in `split` the fewest
    open connections first (then the highest rank). May return fewer than `count`."""
    old_enough = [r for r in replicas if r.age_s >= min_age_s and r.draining_for_s is None]
    if split:
        order = sorted(old_enough, key=lambda r: (r.connections, -r.rank))
    else:
        order = sorted((r for r in old_enough if r.rank != 0), key=lambda r: -r.rank)
    return [r.task_id for r in order[: max(count, 0)]]


def overdue_drains(replicas: Sequence[Replica], limit_s: float = DRAIN_LIMIT_S) -> list[str]:
    """Replicas draining for longer than `limit_s`: they are ended."""
    return [
        r.task_id for r in replicas if r.draining_for_s is not None and r.draining_for_s > limit_s
    ]


def safe_scale_down(
    replicas: Sequence[Replica], target: int, *, split: bool, min_age_s: float = MIN_REPLICA_AGE_S
) -> int:
    """The size a scale-down to `target` may really go to, given the live replicas.

    Members are ranks `0..size-1` and a scale-down removes the highest ranks, so the removal
    stops at the first replica (from the top) that must stay: one younger than `min_age_s`,
    or rank 0 of a group outside `split`. Returns a size >= `target`.
    """
    size = target
    for r in sorted(replicas, key=lambda r: -r.rank):
        if r.rank < size:
            break
        keep = r.age_s < min_age_s and r.draining_for_s is None
        if keep or (r.rank == 0 and not split):
            size = r.rank + 1
            break
    return size


def keep_safe(
    d: Decision, replicas: Sequence[Replica], *, split: bool, min_age_s: float = MIN_REPLICA_AGE_S
) -> Decision:
    """`d` with its scale-down kept off young replicas, and off rank 0 outside `split`: a
    `split` group sheds any old enough replica (the least busy, by the reconcile pass),
    others their highest ranks."""
    if not d.changes or d.replicas > d.current:
        return d
    if split:
        gone = choose_removals(replicas, d.current - d.replicas, split=True, min_age_s=min_age_s)
        size = d.current - len(gone)
    else:
        size = safe_scale_down(replicas, d.replicas, split=False, min_age_s=min_age_s)
    if size >= d.current:
        why = Why.AT_TARGET if d.current == 1 and not split else Why.YOUNG_REPLICAS
        return Decision(why, d.current, d.computed, d.current)
    return Decision(d.why, d.current, d.computed, size)


def autoscale_decision(
    cfg: AutoScale,
    inp: Inputs,
    replicas: Sequence[Replica],
    *,
    split: bool,
    min_age_s: float = MIN_REPLICA_AGE_S,
) -> Decision:
    """What the AutoScaler decides for one group on one pass: `decide_autoscale`, then
    `keep_safe`. The AutoScaler and the policy replay both call this."""
    return keep_safe(decide_autoscale(cfg, inp), replicas, split=split, min_age_s=min_age_s)


# Router figures that add up over replicas (divided by the replica count) and those that
# are already per request (kept as they are).
_ADDITIVE = {
    Metric.QPS: "requests_per_second",
    Metric.CONCURRENCY: "concurrent_requests",
    Metric.QUEUE_DEPTH: "queued_requests",
}


def metric_value(metric: Metric, samples: Sequence[ServingMetrics], current: int) -> float | None:
    """The per-replica value of a router metric from the latest figures of each gateway
    process (None: no figures). Totals add up over gateways and are divided by `current`;
    `latency_p95_ms` is the worst p95 any gateway saw."""
    if not samples or metric is Metric.GPU_UTILIZATION:
        return None
    if metric is Metric.LATENCY_P95_MS:
        return max(s.latency_p95_ms for s in samples)
    total = sum(float(getattr(s, _ADDITIVE[metric])) for s in samples)
    return total / max(current, 1)
