"""The planner: one evaluation turns a ClusterSnapshot and the pending tasks into a Plan.

Tasks are taken highest priority first, oldest first within a priority. Each placement is
reserved in a working copy (`Ledger`) before the next task is looked at, so one batch never
over-commits a card, a node or a quota. A task that fits nowhere may ask for preemption of
preemptible, strictly lower-priority work on one node; it is not placed in the same round
but waits for the capacity to free. A gang is placed whole in one round or not at all.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import MappingProxyType

from libs.domain.states import TaskStatus

from .feasibility import (
    NODE_STAGE_ORDER,
    Fit,
    NodeUsage,
    Quota,
    allocation_cost,
    check_backoff,
    check_node,
    check_quota_floor,
    usage_of,
)
from .model import (
    Allocation,
    ClusterSnapshot,
    Gpu,
    Node,
    PendingTask,
    Placement,
    Plan,
    Preemption,
    Unplaced,
    gpu_matches,
)
from .reasons import CAPACITY_REASONS, Reason, Verdict
from .scoring import rank, seeded_shuffle

# Holding statuses on their way out: their capacity frees without anybody's help.
LEAVING: frozenset[TaskStatus] = frozenset(
    {TaskStatus.STOPPING, TaskStatus.DRAINING, TaskStatus.PREEMPTING}
)
DEFAULT_MAX_BATCH = 256


@dataclass(frozen=True, slots=True)
class Evaluation:
    """What stays fixed during one evaluation: the snapshot and indexes over it."""

    snapshot: ClusterSnapshot
    nodes: tuple[Node, ...]  # sorted by id, so every pass is deterministic
    gpus: Mapping[str, Gpu]

    @classmethod
    def of(cls, snapshot: ClusterSnapshot) -> Evaluation:
        nodes = tuple(sorted(snapshot.nodes, key=lambda n: n.id))
        return cls(snapshot, nodes, MappingProxyType(snapshot.gpus_by_id()))

    def quota(self, ledger: Ledger, tenant_id: str) -> Quota | None:
        limit = self.snapshot.quota_of(tenant_id)
        if limit <= 0:
            return None
        return Quota(tenant_id, limit, ledger.tenant_used.get(tenant_id, 0.0))


@dataclass(frozen=True, slots=True)
class Ledger:
    """The working copy of what holds resources. Every change returns a new ledger.

    Node usage is kept alongside the allocations and recomputed only for the node a change
    touches, so checking a task against every node stays cheap.
    """

    by_node: Mapping[str, tuple[Allocation, ...]] = field(default_factory=dict)
    usage: Mapping[str, NodeUsage] = field(default_factory=dict)
    tenant_used: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_snapshot(cls, snapshot: ClusterSnapshot, gpus: Mapping[str, Gpu]) -> Ledger:
        by_node: dict[str, tuple[Allocation, ...]] = {}
        used: dict[str, float] = {}
        for a in snapshot.holding():
            by_node[a.node_id] = (*by_node.get(a.node_id, ()), a)
            used[a.tenant_id] = used.get(a.tenant_id, 0.0) + allocation_cost(a, gpus)
        usage = {node_id: usage_of(allocs) for node_id, allocs in by_node.items()}
        return cls(by_node, usage, used)

    def on(self, node_id: str) -> tuple[Allocation, ...]:
        return self.by_node.get(node_id, ())

    def usage_on(self, node_id: str) -> NodeUsage:
        return self.usage.get(node_id, _IDLE)

    def _with(
        self, node_id: str, allocs: tuple[Allocation, ...], used: Mapping[str, float]
    ) -> Ledger:
        by_node = {**self.by_node, node_id: allocs}
        usage = {**self.usage, node_id: usage_of(allocs)}
        return Ledger(by_node, usage, used)

    def reserve(self, alloc: Allocation, cost: float) -> Ledger:
        used = dict(self.tenant_used)
        used[alloc.tenant_id] = used.get(alloc.tenant_id, 0.0) + cost
        return self._with(alloc.node_id, (*self.on(alloc.node_id), alloc), used)

    def mark_leaving(self, node_id: str, task_ids: frozenset[str]) -> Ledger:
        """Victims turn `preempting`: they still hold (and count) until they are gone."""
        moved = tuple(
            replace(a, status=TaskStatus.PREEMPTING) if a.task_id in task_ids else a
            for a in self.on(node_id)
        )
        return self._with(node_id, moved, self.tenant_used)


_IDLE = NodeUsage()


@dataclass(frozen=True, slots=True)
class Outcome:
    placement: Placement | None = None
    unplaced: Unplaced | None = None
    preemption: Preemption | None = None


Failure = tuple[Node, Verdict]


def plan(
    snapshot: ClusterSnapshot,
    pending: Sequence[PendingTask],
    *,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> Plan:
    """Place as many of `pending` as fit, in priority order; explain every other one.

    At most `max_batch` tasks are evaluated (a gang counts as its members and is never
    split); the rest are returned in `Plan.deferred`. Tasks still in retry backoff are
    answered with BACKOFF without using the batch.
    """
    if max_batch < 1:
        raise ValueError("max_batch must be at least 1")
    ev = Evaluation.of(snapshot)
    ledger = Ledger.from_snapshot(snapshot, ev.gpus)
    outcomes: list[Outcome] = []
    deferred: list[str] = []
    budget = max_batch
    for unit in _units(pending):
        first, is_gang = unit[0], unit[0].gang_id is not None
        if not is_gang and not (wait := check_backoff(first, snapshot.now)).ok:
            outcomes.append(_unplaced(first, wait))
            continue
        if budget <= 0:
            deferred.extend(t.task_id for t in unit)
            continue
        budget -= len(unit)
        if is_gang:
            results, ledger = place_gang(ev, ledger, unit)
            outcomes.extend(results)
        else:
            outcome, ledger = schedule_task(ev, ledger, first, preempt=True)
            outcomes.append(outcome)
    return _collect(outcomes, deferred)


def _order_key(task: PendingTask) -> tuple[int, datetime, str]:
    return (-task.priority, task.created_at, task.task_id)


def _units(pending: Sequence[PendingTask]) -> list[list[PendingTask]]:
    """Single tasks and gangs in scheduling order; a gang sits where its first member does."""
    units: list[list[PendingTask]] = []
    gangs: dict[str, list[PendingTask]] = {}
    for task in sorted(pending, key=_order_key):
        if task.gang_id is None:
            units.append([task])
        elif task.gang_id in gangs:
            gangs[task.gang_id].append(task)
        else:
            gangs[task.gang_id] = [task]
            units.append(gangs[task.gang_id])
    return units


def _collect(outcomes: Sequence[Outcome], deferred: Sequence[str]) -> Plan:
    return Plan(
        placements=tuple(o.placement for o in outcomes if o.placement),
        preemptions=tuple(o.preemption for o in outcomes if o.preemption),
        unplaced=tuple(o.unplaced for o in outcomes if o.unplaced),
        deferred=tuple(deferred),
    )


def _unplaced(task: PendingTask, verdict: Verdict) -> Outcome:
    assert verdict.reason is not None
    return Outcome(unplaced=Unplaced(task.task_id, verdict.reason, verdict.message))


# --- one task ------------------------------------------------------------------------


def schedule_task(
    ev: Evaluation, ledger: Ledger, task: PendingTask, *, preempt: bool
) -> tuple[Outcome, Ledger]:
    """Place one task on the best node, or explain why not (and maybe ask for preemption)."""
    quota = ev.quota(ledger, task.tenant_id)
    for verdict in (check_backoff(task, ev.snapshot.now), check_quota_floor(task, quota)):
        if not verdict.ok:
            return _unplaced(task, verdict), ledger
    if not ev.nodes:
        return Outcome(
            unplaced=Unplaced(task.task_id, Reason.NO_NODES, "the cluster has no nodes")
        ), ledger
    fits, failures = _evaluate(ev, ledger, task, quota)
    if fits:
        best = rank(fits, task)[0]
        placement = Placement(
            task_id=task.task_id,
            node_id=best.node.id,
            gpu_ids=best.grant.gpu_ids,
            qos=best.grant.qos,
            fractions=best.grant.fractions,
        )
        return Outcome(placement=placement), ledger.reserve(_holding(task, best), best.cost)
    unplaced = explain(ev, task, failures)
    if preempt and unplaced.reason in CAPACITY_REASONS:
        return _preempt(ev, ledger, task, unplaced, failures)
    return Outcome(unplaced=unplaced), ledger


def _evaluate(
    ev: Evaluation, ledger: Ledger, task: PendingTask, quota: Quota | None
) -> tuple[list[Fit], list[Failure]]:
    fits: list[Fit] = []
    failures: list[Failure] = []
    for node in ev.nodes:
        verdict, fit = check_node(task, node, ledger.usage_on(node.id), quota=quota)
        if fit is not None:
            fits.append(fit)
        else:
            failures.append((node, verdict))
    return fits, failures


def _holding(task: PendingTask, fit: Fit) -> Allocation:
    """The allocation a placement (or a reservation behind a preemption) adds to the ledger."""
    req = task.requirement
    return Allocation(
        task_id=task.task_id,
        tenant_id=task.tenant_id,
        node_id=fit.node.id,
        status=TaskStatus.SCHEDULED,
        gpu_ids=fit.grant.gpu_ids,
        fractions=fit.grant.fractions,
        memory_mb=req.memory_mb,
        cpu_cores=req.cpu_cores,
        priority=task.priority,
        anti_affinity=req.anti_affinity,
    )


# --- why not -------------------------------------------------------------------------

_STAGE_RANK: dict[Reason, int] = {r: i for i, r in enumerate(NODE_STAGE_ORDER)}


def explain(ev: Evaluation, task: PendingTask, failures: Sequence[Failure]) -> Unplaced:
    """Report the node that got furthest through the stage chain (the "closest" one).

    Ties go to the first node by id. Cluster-wide phrasing replaces the node's message where
    it is more useful, and a tally of every node's reason is appended.
    """
    node, closest = max(failures, key=lambda f: _STAGE_RANK[_reason_of(f[1])])
    reason = _reason_of(closest)
    message = closest.message
    wanted = task.requirement.gpu_type
    if reason is Reason.GPU_TYPE_UNAVAILABLE and not any(
        gpu_matches(g, wanted) for n in ev.nodes if n.online for g in n.gpus
    ):
        message = f"no online node has GPU type {wanted!r}"
    elif reason is Reason.PINNED_ELSEWHERE:
        message = _pin_message(ev, task)
    elif reason is Reason.NODE_OFFLINE and not task.pins:
        message = "every node is offline"
    if len(failures) > 1:
        message += f" [{_tally(failures)}]"
    return Unplaced(task.task_id, reason, message)


def _pin_message(ev: Evaluation, task: PendingTask) -> str:
    known = {n.id for n in ev.nodes}
    missing = [p for p in task.pins if p not in known]
    if missing:
        return f"task is pinned to node {missing[0]!r}, which is not in the cluster"
    return f"task is pinned to nodes {' and '.join(map(repr, task.pins))}; no node is both"


def _reason_of(verdict: Verdict) -> Reason:
    assert verdict.reason is not None
    return verdict.reason


def _tally(failures: Sequence[Failure]) -> str:
    counts = Counter(_reason_of(v).value for _, v in failures)
    parts = ", ".join(f"{n} {r}" for r, n in sorted(counts.items(), key=lambda c: (-c[1], c[0])))
    return f"{len(failures)} nodes checked: {parts}"


# --- preemption ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Option:
    node: Node
    victims: tuple[Allocation, ...]  # empty: capacity is already on its way out, just wait
    fit: Fit


def _preempt(
    ev: Evaluation,
    ledger: Ledger,
    task: PendingTask,
    unplaced: Unplaced,
    failures: Sequence[Failure],
) -> tuple[Outcome, Ledger]:
    options = [
        opt
        for node, verdict in failures
        if verdict.reason in CAPACITY_REASONS
        and (opt := _option_on(ev, ledger, task, node)) is not None
    ]
    waiting = [o for o in options if not o.victims]
    if waiting:
        note = f"; waiting for capacity being released on node {waiting[0].node.id!r}"
        return Outcome(unplaced=replace(unplaced, message=unplaced.message + note)), ledger
    if not options:
        return Outcome(unplaced=unplaced), ledger
    shuffled = seeded_shuffle(options, task.task_id, key=lambda o: o.node.id)
    best = min(shuffled, key=_victim_cost)
    victims = tuple(a.task_id for a in best.victims)
    ledger = ledger.mark_leaving(best.node.id, frozenset(victims))
    # Hold the freed capacity for this task so nobody else in the round takes it.
    ledger = ledger.reserve(_holding(task, best.fit), best.fit.cost)
    note = f"; preempting {len(victims)} lower-priority task(s) on node {best.node.id!r}"
    outcome = Outcome(
        unplaced=replace(unplaced, message=unplaced.message + note),
        preemption=Preemption(task.task_id, best.node.id, victims),
    )
    return outcome, ledger


def _victim_cost(option: _Option) -> tuple[int, int, int]:
    prios = [a.priority for a in option.victims]
    return (len(prios), max(prios), sum(prios))


def _option_on(ev: Evaluation, ledger: Ledger, task: PendingTask, node: Node) -> _Option | None:
    """The smallest set of victims on `node` that lets `task` fit, or None."""
    allocs = ledger.on(node.id)
    leaving = [a for a in allocs if a.status in LEAVING]
    if leaving and (ready := _fit_without(ev, ledger, task, node, leaving)) is not None:
        return _Option(node, (), ready)
    pool = sorted(
        (
            a
            for a in allocs
            if a.status not in LEAVING and a.preemptible and a.priority < task.priority
        ),
        key=lambda a: (a.priority, -allocation_cost(a, ev.gpus), -a.memory_mb, a.task_id),
    )
    chosen: list[Allocation] = []
    fit: Fit | None = None
    for victim in pool:
        chosen.append(victim)
        fit = _fit_without(ev, ledger, task, node, leaving + chosen)
        if fit is not None:
            break
    if fit is None:
        return None
    # Greedy may have taken more than needed: give back victims, highest priority first.
    for victim in sorted(chosen, key=lambda a: -a.priority):
        rest = [a for a in chosen if a is not victim]
        if (trial := _fit_without(ev, ledger, task, node, leaving + rest)) is not None:
            chosen, fit = rest, trial
    return _Option(node, tuple(chosen), fit)


def _fit_without(
    ev: Evaluation,
    ledger: Ledger,
    task: PendingTask,
    node: Node,
    removed: Sequence[Allocation],
) -> Fit | None:
    gone = {a.task_id for a in removed}
    rest = [a for a in ledger.on(node.id) if a.task_id not in gone]
    quota = ev.quota(ledger, task.tenant_id)
    if quota is not None:
        refund = sum(allocation_cost(a, ev.gpus) for a in removed if a.tenant_id == task.tenant_id)
        quota = replace(quota, used=quota.used - refund)
    _, fit = check_node(task, node, usage_of(rest), quota=quota)
    return fit


# --- gangs ---------------------------------------------------------------------------


def place_gang(
    ev: Evaluation, ledger: Ledger, members: Sequence[PendingTask]
) -> tuple[list[Outcome], Ledger]:
    """All members placed in this round, or none (GANG_INCOMPLETE). Gangs never preempt."""
    gang = members[0].gang_id
    expected = max(m.gang_size for m in members)
    if expected > len(members):
        msg = f"gang {gang!r}: only {len(members)} of {expected} members are pending"
        return [_gang_incomplete(m, msg) for m in members], ledger
    trial = ledger
    placed: list[Outcome] = []
    for member in members:
        outcome, trial = schedule_task(ev, trial, member, preempt=False)
        if outcome.placement is None:
            assert outcome.unplaced is not None
            why = outcome.unplaced
            msg = (
                f"gang {gang!r} is placed whole or not at all; member {member.task_id!r} "
                f"cannot be placed ({why.reason.value}: {why.message})"
            )
            others = [_gang_incomplete(m, msg) for m in members if m is not member]
            return [outcome, *others], ledger
        placed.append(outcome)
    return placed, trial


def _gang_incomplete(task: PendingTask, message: str) -> Outcome:
    return Outcome(unplaced=Unplaced(task.task_id, Reason.GANG_INCOMPLETE, message))
