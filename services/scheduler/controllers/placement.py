"""The placement loop: read the cluster, plan, commit the plan with compare-and-set.

Only the lease holder runs it (on the controller runtime, libs/controller.py), so exactly one
scheduler places at a time even when several replicas run, and every commit goes through the
term's writer (`term.writer`, carrying its fence): a deposed holder's late commit is refused by
the store. The plan comes from the pure core (services/scheduler/placement/), whose `Planner`
keeps its node index from one round to the next. Each commit is conditioned on
`expected_status` (pending for placements, the victim's status for preemptions): a task that
moved since the snapshot is skipped and reconsidered next round, never double-placed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import structlog
from prometheus_client import Counter, Gauge, Histogram

from libs.controller import Controller, Term
from libs.domain.reasons import ReasonCode
from libs.domain.task import decide as commands
from libs.domain.task.model import Task
from libs.domain.task.states import Actor, TaskStatus
from libs.store.eventstore import EventStore
from libs.store.fenced import FencedWriter

from .. import view
from ..placement.loans import Loan, plan_loans
from ..placement.model import Plan
from ..placement.planner import DEFAULT_MAX_CANDIDATES, Planner
from . import lending

log = structlog.get_logger(__name__)

ATTEMPTS = Counter(
    "heteroflow_schedule_attempts_total", "Scheduling decisions by result", ["result"]
)
LATENCY = Histogram(
    "heteroflow_scheduling_round_seconds",
    "Duration of one scheduling round",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
PENDING = Gauge(
    "heteroflow_pending_tasks", "Pending tasks in the scheduler's window, by tenant", ["tenant"]
)
UNPLACED = Gauge(
    "heteroflow_unplaced_tasks", "Tasks the last round left pending, by reason code", ["reason"]
)


@dataclass
class RoundResult:
    placed: int = 0
    preempted: int = 0
    unplaced: int = 0
    conflicts: int = 0
    seconds: float = 0.0
    plan_seconds: float = 0.0  # of `seconds`: the pure planner (the rest is reading and commit)
    placements: list[str] = field(default_factory=list)


@dataclass
class Placer:
    store: EventStore
    clock: Callable[[], datetime]
    batch: int = 512
    # The term's writer, set for each term by PlacementController; without one (a benchmark
    # holding no lease) the placer writes to the store itself.
    writer: FencedWriter | None = None
    max_candidates: int | None = DEFAULT_MAX_CANDIDATES
    cluster: view.ClusterView = field(default_factory=view.ClusterView)
    queue: view.PendingQueue = field(default_factory=view.PendingQueue)
    planner: Planner = field(default_factory=Planner)
    # The last round left a task waiting for a node's in-flight starts (STARTS_IN_FLIGHT):
    # a start reaching running is then worth a round (handlers/wake.py, `frees_a_start`).
    waiting_on_starts: bool = False

    @property
    def writes(self) -> lending.Writes:
        return self.writer or self.store

    async def round(self) -> RoundResult:
        started = time.perf_counter()
        await lending.settle(self.store, self.writes)  # lent cards back, queued wakes run
        pending = await self.queue.load(self.store, self.batch)
        counts: dict[str, int] = {}
        for t in pending:
            counts[t.tenant_id] = counts.get(t.tenant_id, 0) + 1
        PENDING.clear()
        for tenant, n in counts.items():
            PENDING.labels(tenant).set(n)
        if not pending:
            return RoundResult()
        _, quotas, gangs, (queues, pools), group_variants = await asyncio.gather(
            self.cluster.refresh(self.store),
            view.load_quotas(self.store),
            view.load_gangs(self.store, pending),
            view.load_admission(self.store),
            view.load_group_variants(self.store, pending),
        )
        snap = self.cluster.snapshot(self.clock(), quotas, queues, pools)
        planning = time.perf_counter()
        pendings = self.queue.pendings(pending, gangs, group_variants)
        result_plan = self.planner.plan(
            snap,
            pendings,
            max_batch=self.batch,
            max_candidates=self.max_candidates,
        )
        loans = plan_loans(snap, pendings, result_plan)
        plan_seconds = time.perf_counter() - planning
        result = await self.commit(_without(result_plan, loans), {t.id: t for t in pending})
        if loans:
            borrowers = await lending.lend(self.writes, loans)
            self.cluster.learn(borrowers)
            result.placed += len(borrowers)
            result.placements += [t.id for t in borrowers]
        result.seconds = time.perf_counter() - started
        result.plan_seconds = plan_seconds
        LATENCY.observe(result.seconds)
        return result

    async def commit(self, p: Plan, pending: dict[str, Task]) -> RoundResult:
        decisions: dict[str, commands.Decide] = {}
        for pl in p.placements:
            decisions[pl.task_id] = _place(
                pl.node_id,
                pl.gpu_ids,
                pl.qos.value if pl.qos else "",
                pl.gpu_label,
                pl.ports,
                pl.scores,
                pl.variant,
            )
        victims: dict[str, commands.Decide] = {}
        for pre in p.preemptions:
            for victim in pre.victims:
                victims[victim] = _preempt(pre.task_id)
        by_reason: dict[str, int] = {}
        for un in p.unplaced:
            by_reason[un.reason.value] = by_reason.get(un.reason.value, 0) + 1
            t = pending.get(un.task_id)
            if t is not None and (t.pending_reason_code, t.pending_reason) != (un.reason, un.text):
                decisions.setdefault(un.task_id, _why(un.reason, un.text))
        self.waiting_on_starts = ReasonCode.STARTS_IN_FLIGHT.value in by_reason
        UNPLACED.clear()
        for reason, n in by_reason.items():
            UNPLACED.labels(reason).set(n)
        # The round read these tasks a moment ago: the store reuses each one whose version
        # is unchanged under the lock instead of reading and parsing it again.
        done, refused = await self.writes.execute_batch(decisions, known=pending)
        self.cluster.learn(done.values())
        if victims:
            v_done, v_refused = await self.writes.execute_batch(victims)
            self.cluster.learn(v_done.values())
            refused |= v_refused
        if refused:
            self.cluster.invalidate()  # a task moved under us: list what is held again
        result = RoundResult(
            placed=sum(1 for pl in p.placements if pl.task_id in done),
            preempted=len(victims) - len(refused.keys() & victims.keys()),
            unplaced=len(p.unplaced),
            conflicts=len(refused),
            placements=[pl.task_id for pl in p.placements if pl.task_id in done],
        )
        ATTEMPTS.labels("placed").inc(result.placed)
        ATTEMPTS.labels("unplaced").inc(result.unplaced)
        ATTEMPTS.labels("conflict").inc(result.conflicts)
        if result.placed or result.preempted or result.conflicts:
            log.info(
                "scheduling_round",
                placed=result.placed,
                preempted=result.preempted,
                unplaced=result.unplaced,
                conflicts=result.conflicts,
            )
        return result


def _without(p: Plan, loans: Sequence[Loan]) -> Plan:
    """The plan less the "why pending" of the tasks a loan places."""
    if not loans:
        return p
    borrowers = {loan.borrower_task_id for loan in loans}
    return replace(p, unplaced=tuple(u for u in p.unplaced if u.task_id not in borrowers))


def _place(
    node_id: str,
    gpu_ids: tuple[str, ...],
    qos: str,
    label: str = "",
    ports: Mapping[str, int] | None = None,
    scores: Mapping[str, float] | None = None,
    variant: int | None = None,
) -> commands.Decide:
    # The ports travel with the placement, in its one event: a replay gives them back, and
    # the task's end (any status out of GPU_HOLDING) releases them. The chosen node's named
    # scores (placement/rankers.py) are recorded with it: why this node.
    extra: dict[str, Any] = {"ports": dict(ports)} if ports else {}
    if scores:
        extra["scores"] = dict(scores)
    if variant is not None:
        # The task's variant this placement runs (docs/scheduling.md#variants).
        extra["variant"] = variant

    def decide(t: Task) -> list[Any]:
        return list(
            commands.decide_transition(
                t,
                TaskStatus.SCHEDULED,
                actor=Actor.SCHEDULER,
                expected_status=TaskStatus.PENDING,
                reason_code=ReasonCode.PLACED,
                reason="placed" if variant is None else f"placed variants[{variant}]",
                node_id=node_id,
                gpu_ids=gpu_ids,
                qos=qos,
                gpu_label=label,
                **extra,
            )
        )

    return decide


def _preempt(preemptor: str) -> commands.Decide:
    def decide(t: Task) -> list[Any]:
        return list(
            commands.decide_transition(
                t,
                TaskStatus.PREEMPTING,
                actor=Actor.SCHEDULER,
                expected_status=t.status,
                reason_code=ReasonCode.PREEMPTED,
                reason=f"preempted by {preemptor}",
            )
        )

    return decide


def _why(code: ReasonCode, text: str) -> commands.Decide:
    def decide(t: Task) -> list[Any]:
        return list(commands.decide_pending_reason(t, code, text))

    return decide


class PlacementController(Controller):
    """Rounds back to back while there is work; otherwise wait for a wake-up or `idle_s`."""

    name = "scheduling_round"
    error_backoff_s = 1.0

    def __init__(self, placer: Placer, wake: asyncio.Event, idle_s: float = 0.5) -> None:
        self.placer = placer
        self.wake = wake
        self.interval_s = idle_s

    async def elected(self, term: Term) -> None:
        self.placer.writer = term.writer
        self.placer.cluster.invalidate()  # another leader may have placed since our last term

    async def evaluate(self, term: Term) -> bool:
        result = await self.placer.round()
        return bool(result.placed or result.preempted)
