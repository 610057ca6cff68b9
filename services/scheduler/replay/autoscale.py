"""Autoscaler replay: the recorded `group_autoscale_sampled` events re-run through the
AutoScaler's own decision (`autoscale_decision`, libs/domain/group/autoscale.py) with changed
`auto_scale` settings (`--set autoscaler.<group>.<field>=...`), per group, recorded beside
replayed: replica-count changes, replica-hours, GPU-hours, time above target.

The load is the recorded one: a figure that adds up over replicas (qps, concurrency,
queue_depth, gpu_utilization) keeps its recorded total and is divided by the replayed
replica count; latency_p95_ms is kept as read. How load would have reacted to other capacity
is not modelled. The passes run at each recorded sample's time and, between samples, every
`interval_s` after it up to half an interval before the next (a pass left unrecorded saw the
same data). Until the replay decides otherwise than the log, each pass takes its replica
count, cooldown clocks and replica ages from the sample; from the first difference on it
keeps its own, and a scale by hand or by a schedule window sets its count as in the log.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from libs.domain.group.autoscale import (
    AutoScale,
    Inputs,
    Metric,
    Replica,
    autoscale_decision,
)
from libs.domain.group.events import GroupScaled
from libs.domain.group.policy import GroupAutoscaleDecided, GroupAutoscaleSampled

from .policy import PolicyError

ADDITIVE = frozenset({Metric.QPS, Metric.CONCURRENCY, Metric.QUEUE_DEPTH, Metric.GPU_UTILIZATION})

ScaleChange = tuple[float, int, int]  # (pass time, from, to)


@dataclass
class GroupLog:
    """One group's autoscaling as recorded: samples, the decisions that changed its size
    (timed by the sample they were made on), and scales by anyone else."""

    group_id: str
    name: str = ""
    samples: list[GroupAutoscaleSampled] = field(default_factory=list)
    changes: list[ScaleChange] = field(default_factory=list)
    changed_at: list[int] = field(default_factory=list)  # index of the sample of each change
    external: list[tuple[float, int]] = field(default_factory=list)  # (time, to)


class AutoscaleLog:
    """Built from the log's group events in order (record.py hands them in)."""

    def __init__(self) -> None:
        self.groups: dict[str, GroupLog] = {}

    def add(self, payload: Any, at: float, name: str) -> None:
        if isinstance(payload, GroupAutoscaleSampled):
            mine = self.groups.setdefault(payload.group_id, GroupLog(payload.group_id))
            mine.name = name
            mine.samples.append(payload)
            return
        g = self.groups.get(getattr(payload, "group_id", ""))
        if isinstance(payload, GroupAutoscaleDecided) and payload.replicas != payload.current:
            if g is not None and g.samples:  # a decision before sampling began: not replayed
                g.changes.append((g.samples[-1].at, payload.current, payload.replicas))
                g.changed_at.append(len(g.samples) - 1)
        elif isinstance(payload, GroupScaled) and payload.source != "autoscaler" and g:
            g.external.append((at, payload.to_replicas))

    def window(self, since: float) -> list[GroupLog]:
        """The groups sampled from `since` on, their samples and changes cut to it."""
        out = []
        for gid in sorted(self.groups):
            g = self.groups[gid]
            first = next((i for i, s in enumerate(g.samples) if s.at >= since), None)
            if first is None:
                continue
            cut = GroupLog(g.group_id, g.name, g.samples[first:])
            for c, i in zip(g.changes, g.changed_at, strict=True):
                if i >= first:
                    cut.changes.append(c)
                    cut.changed_at.append(i - first)
            cut.external = [e for e in g.external if e[0] >= since]
            out.append(cut)
        return out


def settings_over(cfg: AutoScale, over: Mapping[str, Any] | None) -> AutoScale:
    if not over:
        return cfg
    try:
        return AutoScale.model_validate(cfg.model_dump() | dict(over))
    except ValidationError as exc:
        raise PolicyError(f"autoscaler settings refused: {exc.errors()[0]['msg']}") from None


@dataclass
class GroupTrace:
    """One run of a group (recorded or replayed) over the window."""

    changes: list[ScaleChange] = field(default_factory=list)
    replica_s: float = 0.0
    gpu_s: float = 0.0
    above_target_s: float = 0.0

    def view(self) -> dict[str, Any]:
        return {
            "scale_events": len(self.changes),
            "replica_hours": round(self.replica_s / 3600.0, 3),
            "gpu_hours": round(self.gpu_s / 3600.0, 3),
            "above_target_s": round(self.above_target_s, 1),
        }


def _value(s: GroupAutoscaleSampled, current: int) -> float | None:
    """The per-replica figure the pass reads with `current` replicas, the load as recorded."""
    if s.value is None or current == s.current:
        return s.value
    if s.auto_scale.metric is Metric.GPU_UTILIZATION and current == 0:
        return None
    if s.auto_scale.metric not in ADDITIVE:
        return s.value
    return s.value * max(s.current, 1) / max(current, 1)


class _Segments:
    """The trace's running totals: each pass opens a segment that the next one closes."""

    def __init__(self, trace: GroupTrace) -> None:
        self.trace = trace
        self.start: float | None = None
        self.replicas, self.gpu, self.above = 0, 0.0, False

    def move(self, t: float, replicas: int = 0, gpu: float = 0.0, above: bool = False) -> None:
        if self.start is not None and t > self.start:
            span = t - self.start
            self.trace.replica_s += self.replicas * span
            self.trace.gpu_s += self.replicas * gpu * span
            self.trace.above_target_s += span if self.above else 0.0
        self.start, self.replicas, self.gpu, self.above = t, replicas, gpu, above


def _above(value: float | None, cfg: AutoScale) -> bool:
    return value is not None and value > cfg.target


def recorded(g: GroupLog, until: float) -> GroupTrace:
    """What happened: from each sample to the next, its replicas (after its decision)."""
    trace = GroupTrace(changes=list(g.changes))
    at_sample = dict(zip(g.changed_at, g.changes, strict=True))
    seg = _Segments(trace)
    for i, s in enumerate(g.samples):
        current = at_sample[i][2] if i in at_sample else s.current
        seg.move(s.at, current, s.gpu_per_replica, _above(s.value, s.auto_scale))
    seg.move(max(until, g.samples[-1].at))
    return trace


@dataclass
class _State:
    """The replayed group between passes."""

    current: int
    last_up: float | None
    last_scale: float | None
    born: dict[int, float] = field(default_factory=dict)  # ranks the replay created, when
    diverged: bool = False

    def scale(self, to: int, t: float) -> None:
        if to > self.current:
            self.born.update({r: t for r in range(self.current, to)})
            self.last_up = t
        self.current, self.last_scale = to, t


def replayed(g: GroupLog, over: Mapping[str, Any] | None, until: float) -> GroupTrace:
    """The group's passes re-run through `autoscale_decision` with `over` applied.

    A pass that changes nothing is followed by the next one that could: the first at or
    after a cooldown's end, a replica's coming of age or a scale by hand (the passes in
    between would decide the same on the same data)."""
    trace = GroupTrace()
    recorded_at = dict(zip(g.changed_at, g.changes, strict=True))
    first = g.samples[0]
    st = _State(first.current, first.last_up_at, first.last_scale_at)
    external = sorted(g.external)
    seg = _Segments(trace)
    for i, s in enumerate(g.samples):
        end = g.samples[i + 1].at - s.interval_s / 2 if i + 1 < len(g.samples) else until
        cfg = settings_over(s.auto_scale, over)
        k = 0
        while k == 0 or s.at + k * s.interval_s < end:
            t = s.at + k * s.interval_s
            if k == 0 and not st.diverged:
                st.current, st.last_up, st.last_scale = s.current, s.last_up_at, s.last_scale_at
            while st.diverged and external and external[0][0] <= t:
                st.scale(external.pop(0)[1], t)
            value = _value(s, st.current)
            replicas = _replicas(s, st.current, st.born, t)
            d = autoscale_decision(
                cfg,
                _inputs(s, st, value, t),
                replicas,
                split=s.split,
                min_age_s=s.min_replica_age_s,
            )
            mine = (t, d.current, d.replicas) if d.changes else None
            st.diverged = st.diverged or mine != (recorded_at.get(i) if k == 0 else None)
            if mine is not None:
                trace.changes.append(mine)
                st.scale(d.replicas, t)
            seg.move(t, st.current, s.gpu_per_replica, _above(value, cfg))
            if s.interval_s <= 0:
                break
            nxt = None if d.changes else _next_change(cfg, s, st, replicas, external, t)
            if nxt is None and not d.changes:
                break
            skip = 0 if nxt is None else math.ceil((nxt - s.at) / s.interval_s) - 1
            k = max(k + 1, skip)
    seg.move(max(until, g.samples[-1].at))
    return trace


def _inputs(s: GroupAutoscaleSampled, st: _State, value: float | None, t: float) -> Inputs:
    quota = s.quota_left
    if quota is not None and st.current != s.current:
        quota = max(quota - (st.current - s.current) * s.gpu_per_replica, 0.0)
    return Inputs(
        current=st.current,
        metric=value,
        now=t,
        last_up_at=st.last_up,
        last_scale_at=st.last_scale,
        suspended=s.suspended,
        gpu_per_replica=s.gpu_per_replica,
        quota_left=quota,
        window_in_force=s.window_in_force,
        rollout_active=s.rollout_active,
        group_failed=s.group_failed,
    )


def _next_change(
    cfg: AutoScale,
    s: GroupAutoscaleSampled,
    st: _State,
    replicas: list[Replica],
    external: list[tuple[float, int]],
    t: float,
) -> float | None:
    """The first time after `t` at which the same data could be decided otherwise."""
    times = [t + s.min_replica_age_s - r.age_s for r in replicas if r.age_s < s.min_replica_age_s]
    if st.last_up is not None:
        times.append(st.last_up + cfg.cooldown_up_s)
    if st.last_scale is not None:
        times.append(st.last_scale + cfg.cooldown_down_s)
    if st.diverged and external:
        times.append(external[0][0])
    later = [x for x in times if x > t]
    return min(later) if later else None


def _replicas(
    s: GroupAutoscaleSampled, current: int, born: dict[int, float], t: float
) -> list[Replica]:
    """Ranks 0..current-1, each as old as its latest creation, recorded or replayed."""
    out = []
    for rank in range(current):
        seen = (s.born[rank] if rank < len(s.born) else None, born.get(rank))
        times = [x for x in seen if x is not None]
        created = max(times) if times else t
        draining = 0.0 if rank in s.draining else None
        out.append(Replica(str(rank), rank, t - created, draining_for_s=draining))
    return out


def report(
    log: AutoscaleLog, since: float, until: float, over: Mapping[str, Any]
) -> dict[str, Any]:
    """Per sampled group, recorded beside replayed under `over` (group id or name → fields),
    and how many recorded scale decisions the recorded settings replayed give back."""
    rows, same, of = [], 0, 0
    for g in log.window(since):
        mine = recorded(g, until)
        as_recorded = replayed(g, None, until)
        changed = over.get(g.group_id) or over.get(g.name)
        theirs = replayed(g, changed, until) if changed else as_recorded
        same += len(set(mine.changes) & set(as_recorded.changes))
        of += len(mine.changes)
        rows.append(
            {
                "group": g.group_id,
                "name": g.name,
                "metric": g.samples[0].auto_scale.metric.value,
                "samples": len(g.samples),
                "settings": dict(sorted((changed or {}).items())),
                "recorded": mine.view(),
                "replayed": theirs.view(),
            }
        )
    return {"groups": rows, "same_settings_reproduce": {"scale_decisions": same, "of": of}}
