"""The AutoScaler: leader-only, every `interval_s` (30 s by default), each group with
`auto_scale` (docs/autoscaling.md).

One pass per group: read the metric (the router's figures from the bus, or the mean NVML
utilisation of the group's cards from the telemetry store), ask `decide_autoscale` (pure)
what to do, keep a scale-down off young replicas (and off rank 0 outside `split`), then
write through the term's writer (every write under its fence): the decision event and, for a
change, the `group_scaled` event and the new members in one transaction (the same
`decide_scale` manual scale uses). A decision identical to the group's last recorded one is
not written again (a steady group's stream does not grow every pass); the decisions counter
counts every one. Beside a decision, and whenever what it was decided on changed, the pass
records a `group_autoscale_sampled` event (the metric value, the replicas, the settings) for
the policy replay.

Then the reconcile pass, over every group ever scaled (by hand too): members beyond the
group's size still live are shed (libs/domain/group/shedding.py: a `split` group's least
busy by the routers' outstanding requests, marked draining), and draining replicas are
stopped once no router has a request in flight on them, or past the drain limit. A scale-down
and the stops are two writes; a crash between them leaves live members beyond the size, and
this pass finishes the job.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import structlog
from prometheus_client import Counter

from libs.controller import Controller, Term, for_each
from libs.domain.group.autoscale import (
    DRAIN_LIMIT_S,
    MIN_REPLICA_AGE_S,
    AutoScale,
    Decision,
    Inputs,
    Metric,
    Replica,
    Why,
    autoscale_decision,
    metric_value,
    overdue_drains,
)
from libs.domain.group.model import Group, GroupStatus, Parallelism, current_members, is_live
from libs.domain.group.policy import GroupAutoscaleSampled, decided, sampled
from libs.domain.group.router_figures import RouterFigures
from libs.domain.group.scaling import ScalePlan, decide_scale
from libs.domain.group.shedding import candidates, plan_shed, shed_commands
from libs.domain.group.window_control import window_in_force
from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.rollout.model import ACTIVE as ROLLING
from libs.domain.task import decide as commands
from libs.domain.task.model import Task
from libs.domain.task.states import Actor, TaskStatus
from libs.store import groups as group_rows
from libs.store import tasks as task_rows
from libs.store import telemetry
from libs.store import tenants as tenant_rows
from libs.store.eventstore import EventStore, NewTask
from libs.store.fenced import FencedWriter
from libs.store.projections import GROUPS

log = structlog.get_logger(__name__)
S = TaskStatus
META = {"actor": "autoscaler"}

DECISIONS = Counter(
    "heteroflow_autoscaler_decisions_total", "AutoScaler decisions by outcome", ["why"]
)


class AutoScaler(Controller):
    name = "autoscaler"

    def __init__(
        self,
        store: EventStore,
        book: RouterFigures,
        clock: Callable[[], datetime],
        *,
        interval_s: float = 30.0,
        utilization_window_s: float = 60.0,
        min_replica_age_s: float = MIN_REPLICA_AGE_S,
        drain_limit_s: float = DRAIN_LIMIT_S,
    ) -> None:
        self.store = store
        self.book = book
        self.clock = clock
        self.interval_s = interval_s
        self.utilization_window_s = utilization_window_s
        self.min_replica_age_s = min_replica_age_s
        self.drain_limit_s = drain_limit_s
        # Per group, the key of the last sample this instance recorded and the group's
        # version after it: another write since (another leader's, a user's) means record
        # again.
        self._sampled: dict[str, tuple[tuple[object, ...], int]] = {}

    async def evaluate(self, term: Term) -> None:
        await self.scan(term.writer)

    async def scan(self, out: FencedWriter) -> dict[str, Decision]:
        """One pass over every group with `auto_scale`, writing through `out`: group id →
        the decision taken."""
        now = self.clock()
        groups = await group_rows.with_auto_scale(self.store)
        done = await for_each(
            groups, lambda g: self.evaluate_group(g, now, out), "autoscale_failed"
        )
        await self.reconcile(out, now)
        return {group.id: decision for group, decision in done}

    async def reconcile(self, out: FencedWriter, now: datetime) -> None:
        """Shed the members beyond each scaled group's size, end the drains that are done."""
        groups = await group_rows.scalable(self.store)
        await for_each(
            groups, lambda g: self.reconcile_group(g, now, out), "scale_down_reconcile_failed"
        )

    async def reconcile_group(self, group: Group, now: datetime, out: FencedWriter) -> None:
        tasks = await task_rows.of_group(self.store, group.id, include_deleted=False)
        # Draining replicas are often remnants (a rollout's old generation): look at all.
        draining = [self._replica(t, now) for t in tasks if is_live(t) and _draining(t)]
        await self._end_drains(overdue_drains(draining, self.drain_limit_s), out)
        if group.spec.static_world or (group.rollout and group.rollout.phase in ROLLING):
            return  # a fixed world; or a rolling update, whose controller owns the replicas
        idle = [
            r.task_id
            for r in draining
            if r.draining_for_s is not None
            and r.draining_for_s <= self.drain_limit_s
            and self.book.drained(group.id, r.task_id)
        ]
        await self._end_drains(
            idle, out, "drained: no router has a request in flight on it", ReasonCode.SCALED_DOWN
        )
        split = group.spec.shape.parallelism is Parallelism.SPLIT
        shed = plan_shed(
            candidates(tasks, now),
            group.size,
            split=split,
            min_age_s=self.min_replica_age_s,
            outstanding=self.book.outstanding(group.id),
        )
        if shed.empty:
            return
        done, _ = await out.execute_batch(
            shed_commands(shed, Actor.CONTROLLER, "removed by a scale-down"), metadata=META
        )
        log.info(
            "scale_down_shed",
            group_id=group.id,
            draining=sorted(shed.drain),
            stopped=sorted(shed.stop),
            moved=[f"{tid}:{a}->{b}" for tid, a, b in shed.moves],
            written=sorted(done),
        )

    async def evaluate_group(self, group: Group, now: datetime, out: FencedWriter) -> Decision:
        cfg = group.spec.auto_scale
        assert cfg is not None
        tasks = await task_rows.of_group(self.store, group.id, include_deleted=False)
        live = [
            m
            for m in current_members(tasks)
            if m.rank is not None and m.rank < group.size and is_live(m)
        ]
        outstanding = self.book.outstanding(group.id)
        replicas = [self._replica(m, now, outstanding) for m in live]
        current = group.size if live else 0
        value = await self._metric(group, cfg.metric, live, current, now)
        inputs = await self._inputs(group, current, value, now)
        split = group.spec.shape.parallelism is Parallelism.SPLIT
        decision = autoscale_decision(
            cfg, inputs, replicas, split=split, min_age_s=self.min_replica_age_s
        )
        sample = sampled(
            group.id,
            cfg,
            inputs,
            replicas,
            interval_s=self.interval_s,
            split=split,
            min_replica_age_s=self.min_replica_age_s,
        )
        await self._apply(group, tasks, cfg, value, decision, sample, out)
        DECISIONS.labels(decision.why.value).inc()
        if decision.changes:
            log.info(
                "autoscaled",
                group_id=group.id,
                why=decision.why.value,
                replicas=decision.replicas,
                current=decision.current,
            )
        return decision

    def _replica(
        self, m: Task, now: datetime, outstanding: dict[str, int] | None = None
    ) -> Replica:
        # A draining mark or status is the task's last change: `updated_at` dates it.
        since_update = (now - m.updated_at).total_seconds()
        return Replica(
            task_id=m.id,
            rank=m.rank or 0,
            age_s=(now - m.created_at).total_seconds(),
            connections=(outstanding or {}).get(m.id, 0),
            draining_for_s=since_update if _draining(m) else None,
        )

    async def _metric(
        self, group: Group, metric: Metric, live: Sequence[Task], current: int, now: datetime
    ) -> float | None:
        if metric is not Metric.GPU_UTILIZATION:
            return metric_value(metric, self.book.samples(group.id), current)
        if not live:
            return None
        since = now - timedelta(seconds=self.utilization_window_s)
        return await telemetry.mean_utilization(self.store, [m.id for m in live], since)

    async def _inputs(
        self, group: Group, current: int, value: float | None, now: datetime
    ) -> Inputs:
        tenant = await tenant_rows.get_tenant(self.store, group.tenant_id)
        template = group.spec.template
        per_replica = float(template.gpu_required or template.gpu_compute_ratio)
        quota_left: float | None = None
        if tenant is not None and tenant.gpu_quota > 0 and per_replica > 0:
            used = await task_rows.tenant_gpus(self.store, group.tenant_id)
            quota_left = max(tenant.gpu_quota - used, 0.0)
        return Inputs(
            current=current,
            metric=value,
            now=now.timestamp(),
            last_up_at=group.scaled_up_at.timestamp() if group.scaled_up_at else None,
            last_scale_at=group.scaled_at.timestamp() if group.scaled_at else None,
            suspended=bool(tenant and tenant.suspended),
            gpu_per_replica=per_replica,
            quota_left=quota_left,
            window_in_force=window_in_force(group),
            rollout_active=group.rollout is not None and group.rollout.phase in ROLLING,
            group_failed=group.status is GroupStatus.FAILED,
        )

    async def _apply(
        self,
        group: Group,
        tasks: list[Task],
        cfg: AutoScale,
        value: float | None,
        d: Decision,
        sample: GroupAutoscaleSampled,
        out: FencedWriter,
    ) -> None:
        last = group.last_autoscale
        key = sample.key()
        repeat = not d.changes and last is not None and last.same(d)
        if repeat and self._sampled.get(group.id) == (key, group.version):
            return  # the same "no change" on the same data as last time: not recorded again
        event = decided(group.id, cfg.metric, value, d)
        written = False
        plan = ScalePlan()
        split = group.spec.shape.parallelism is Parallelism.SPLIT
        shed = plan_shed(
            candidates(tasks, self.clock()),
            d.replicas,
            split=split,
            min_age_s=self.min_replica_age_s,
            outstanding=self.book.outstanding(group.id),
        )

        def decide(current: Group | None) -> tuple[list[Payload], list[NewTask]]:
            nonlocal plan, written
            if current is None or current.version != group.version:
                return [], []  # changed since we looked: the next pass decides again
            written = True
            # The sample goes first: a replay reads it before the decision it led to.
            events: list[Payload] = [sample] if repeat else [sample, event]
            if d.changes:
                plan = decide_scale(
                    current,
                    tasks,
                    d.replicas,
                    source="autoscaler",
                    code=ReasonCode.AUTOSCALE,
                    reason=event.reason,
                    revive=d.why is Why.SCALE_FROM_ZERO,
                    removed=shed.removed if split and d.replicas < d.current else None,
                )
            if plan.event is not None:
                events.append(plan.event)
            return events, list(plan.new_members(current))

        # The members it removes are shed by the reconcile pass that follows (drained first).
        after, _ = await out.execute_with_tasks(GROUPS, group.id, decide, metadata=META)
        if written and after is not None:
            self._sampled[group.id] = (key, after.version)

    async def _end_drains(
        self,
        ended: list[str],
        out: FencedWriter,
        why: str = "",
        code: ReasonCode = ReasonCode.AUTOSCALE,
    ) -> None:
        if not ended:
            return
        why = why or f"draining for more than {self.drain_limit_s:g} s: ended by the AutoScaler"
        done, _ = await out.execute_batch(
            {tid: _drain_ender(why, code) for tid in ended}, metadata=META
        )
        log.info("autoscale_drains_ended", tasks=sorted(done), why=why)


def _draining(t: Task) -> bool:
    return t.draining or t.status is S.DRAINING


def _drain_ender(why: str, code: ReasonCode = ReasonCode.AUTOSCALE) -> commands.Decide:
    """A `draining` task is cancelled (as rolled-out replicas end); a running one marked
    draining is stopped."""

    def decide(t: Task) -> list[Any]:
        if t.status is S.DRAINING:
            return list(
                commands.decide_transition(
                    t,
                    S.CANCELLED,
                    actor=Actor.CONTROLLER,
                    expected_status=S.DRAINING,
                    reason_code=code,
                    reason=why,
                )
            )
        return list(commands.decide_stop(t, Actor.CONTROLLER, code, why))

    return decide
