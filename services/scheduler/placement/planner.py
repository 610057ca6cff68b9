"""The planner: one evaluation turns a ClusterSnapshot and the pending tasks into a Plan.

Tasks are taken highest priority first, oldest first within a priority. Each placement is
reserved in the working ledger before the next task is looked at, so one batch never
over-commits a card, a node or a quota. A task that fits nowhere may ask for preemption of
preemptible, strictly lower-priority work on one node; it is not placed in the same round
but waits for the capacity to free. A gang is placed whole in one round or not at all.

Large fleets: a task is checked in detail only against the nodes the index cannot rule out,
best-packed first, until `max_candidates` fit (search.py); its "why pending" answer still
counts every node exactly.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import MappingProxyType

from libs.domain.node.model import is_loopback
from libs.domain.task.states import TaskStatus

from .feasibility import (
    Fit,
    Quota,
    allocation_cost,
    check_backoff,
    check_quota_floor,
    usage_of,
)
from .index import ClusterIndex
from .ledger import LEAVING, Ledger
from .model import (
    Allocation,
    ClusterSnapshot,
    Gpu,
    Node,
    PendingTask,
    Placement,
    Plan,
    Preemption,
    Requirement,
    Unplaced,
    Variant,
)
from .queues import check_queue, pool_full, with_queues
from .rankers import named, ranked, seeded_shuffle
from .reasons import CAPACITY_REASONS, Reason, Verdict, reject
from .search import Search, Tally, reason_at, search, tally
from .stages import NODE_STAGE_ORDER, check_node
from .variants import as_variant, open_variants, pin_to_group, refused

DEFAULT_MAX_BATCH = 256
# Fits scored per task (Nomad's "limit"): enough to pack well, few enough to stay flat in
# the fleet's size. None scores every fit.
DEFAULT_MAX_CANDIDATES = 4

# What makes two pending tasks indistinguishable to the search (quota and anti-affinity are
# per tenant; priority matters only to preemption, which runs per task).
ShapeKey = tuple[Requirement, str, frozenset[str], int, str, frozenset[str], float]


@dataclass(frozen=True, slots=True)
class Evaluation:
    """What stays fixed during one evaluation: the snapshot and indexes over it."""

    snapshot: ClusterSnapshot
    index: ClusterIndex
    gpus: Mapping[str, Gpu]
    max_candidates: int | None = DEFAULT_MAX_CANDIDATES
    # Searches that found nothing, by task shape, with the ledger version they saw: the
    # same shape against the same ledger finds nothing again.
    misses: dict[ShapeKey, tuple[int, Search, Unplaced]] = field(default_factory=dict)
    # Node ids by host (Node.host), built on the first task that wants a host port.
    hosts: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        snapshot: ClusterSnapshot,
        max_candidates: int | None = DEFAULT_MAX_CANDIDATES,
        planner: Planner | None = None,
    ) -> Evaluation:
        index, gpus = (planner or Planner()).indexed(snapshot)
        return cls(snapshot, index, gpus, max_candidates)

    @property
    def nodes(self) -> tuple[Node, ...]:
        return self.index.nodes  # sorted by id, so every pass is deterministic

    def node(self, node_id: str) -> Node | None:
        pos = self.index.position.get(node_id)
        return None if pos is None else self.nodes[pos]

    def nodes_on(self, host: str) -> tuple[str, ...]:
        if not self.hosts:
            by_host: dict[str, list[str]] = {}
            for n in self.nodes:
                by_host.setdefault(n.host, []).append(n.id)
            self.hosts.update({h: tuple(ids) for h, ids in by_host.items()})
        return self.hosts.get(host, ())

    def quota(self, ledger: Ledger, tenant_id: str, surge: float = 0.0) -> Quota | None:
        limit = self.snapshot.quota_of(tenant_id)
        if limit <= 0:
            return None
        return Quota(tenant_id, limit, ledger.tenant_used.get(tenant_id, 0.0), surge)


@dataclass(frozen=True, slots=True)
class Outcome:
    placement: Placement | None = None
    unplaced: Unplaced | None = None
    preemption: Preemption | None = None


class Planner:
    """Plans evaluations; keeps the index of the last snapshot's nodes between them.

    The index depends on the nodes alone. A caller that passes the very same nodes tuple
    again (the scheduler does, while no node changed) gets the index built for it last time
    instead of a new one: same input, same index, so plans stay a function of their input.
    The ledger over that index is kept too and updated to each snapshot's allocations
    (`Ledger.update`): it then equals one built from them, so the same holds for it.
    """

    __slots__ = ("_last", "_ledger")

    def __init__(self) -> None:
        self._last: tuple[tuple[Node, ...], ClusterIndex, Mapping[str, Gpu]] | None = None
        self._ledger: Ledger | None = None

    def indexed(self, snapshot: ClusterSnapshot) -> tuple[ClusterIndex, Mapping[str, Gpu]]:
        last = self._last
        if last is None or last[0] is not snapshot.nodes:
            gpus = MappingProxyType(snapshot.gpus_by_id())
            last = self._last = (snapshot.nodes, ClusterIndex(snapshot.nodes), gpus)
        return last[1], last[2]

    def ledger(self, ev: Evaluation) -> Ledger:
        """The working ledger of `ev`'s allocations: last evaluation's, brought to them while
        the index is the same (by the snapshot's delta when it starts from the allocations
        the ledger was last brought to, else by a scan of them all); else a new one."""
        kept, snap = self._ledger, ev.snapshot
        if kept is not None and kept.index is ev.index:
            delta = snap.delta
            if (
                delta is not None
                and delta.since is kept.synced
                and delta.allocations is snap.allocations
            ):
                brought = kept.apply(delta.changed, delta.gone)
            else:
                brought = kept.update(snap.allocations)
            if brought:
                kept.synced = snap.allocations
                return kept
        kept = self._ledger = Ledger(ev.index, snap.allocations, ev.gpus)
        kept.synced = snap.allocations
        return kept

    def plan(
        self,
        snapshot: ClusterSnapshot,
        pending: Sequence[PendingTask],
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_candidates: int | None = DEFAULT_MAX_CANDIDATES,
    ) -> Plan:
        """Place as many of `pending` as fit, in priority order; explain every other one.

        At most `max_batch` tasks are evaluated (a gang counts as its members and is never
        split); the rest are returned in `Plan.deferred`. Tasks still in retry backoff are
        answered with BACKOFF without using the batch. Each task scores at most
        `max_candidates` fitting nodes (None: all of them).
        """
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if max_candidates is not None and max_candidates < 1:
            raise ValueError("max_candidates must be at least 1 (or None)")
        ev = Evaluation.of(snapshot, max_candidates, self)
        ledger = self.ledger(ev)
        outcomes: list[Outcome] = []
        deferred: list[str] = []
        budget = max_batch
        group_variants: dict[str, int] = {}  # variant_group -> the variant placed this round
        for unit in _units(with_queues(pending, snapshot.queues)):
            first, is_gang = unit[0], unit[0].gang_id is not None
            if not is_gang and not (wait := check_backoff(first, snapshot.now)).ok:
                outcomes.append(_unplaced(first, wait))
                continue
            if budget <= 0:
                deferred.extend(t.task_id for t in unit)
                continue
            budget -= len(unit)
            if is_gang:
                outcomes.extend(place_gang_variants(ev, ledger, unit))
            else:
                outcomes.append(_schedule_one(ev, ledger, first, group_variants))
        return _collect(outcomes, deferred)


def plan(
    snapshot: ClusterSnapshot,
    pending: Sequence[PendingTask],
    *,
    max_batch: int = DEFAULT_MAX_BATCH,
    max_candidates: int | None = DEFAULT_MAX_CANDIDATES,
) -> Plan:
    """`Planner.plan` on a planner of its own (nothing kept from one call to the next)."""
    return Planner().plan(snapshot, pending, max_batch=max_batch, max_candidates=max_candidates)


def _order_key(task: PendingTask) -> tuple[int, int, int, datetime, str]:
    # Queue priority first; inside a fifo queue submission order alone (seed 004); a device
    # requeue ahead of the rest of its priority class (expedited requeue).
    return (
        -task.queue_priority,
        0 if task.fifo else -task.priority,
        0 if task.expedited else 1,
        task.created_at,
        task.task_id,
    )


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


def gpu_label(gpus: Sequence[Gpu], granted: Sequence[str]) -> str:
    """`vendor/model` of the first granted card ("" without cards)."""
    for g in gpus:
        if granted and g.id == granted[0]:
            return f"{g.vendor.lower()}/{g.model}"
    return ""


def schedule_task(ev: Evaluation, ledger: Ledger, task: PendingTask, *, preempt: bool) -> Outcome:
    """Place one task on the best node (reserving it in `ledger`), or explain why not and
    maybe ask for preemption."""
    quota = ev.quota(ledger, task.tenant_id, task.surge_cards)
    queue = ev.snapshot.queues.get(task.queue)
    for verdict in (
        check_backoff(task, ev.snapshot.now),
        check_quota_floor(task, quota),
        check_queue(task, queue, ledger.queue_use.get(task.queue)),
    ):
        if not verdict.ok:
            return _unplaced(task, verdict)
    if not ev.nodes:
        return Outcome(unplaced=Unplaced(task.task_id, Reason.NO_NODES, "the cluster has no nodes"))
    found, unplaced = _search(ev, ledger, task, quota)
    if found.fits:
        refused: Verdict | None = None
        for scores, best in ranked(found.fits, task):
            ports = allocate_ports(ev, ledger, task, best.node)
            if isinstance(ports, Verdict):
                refused = refused or ports
                continue
            placement = Placement(
                task_id=task.task_id,
                node_id=best.node.id,
                gpu_ids=best.grant.gpu_ids,
                qos=best.grant.qos,
                fractions=best.grant.fractions,
                gpu_label=gpu_label(best.node.gpus, best.grant.gpu_ids),
                ports=ports,
                scores=named(scores),
            )
            holding = _holding(task, best)
            if ports:
                holding = replace(holding, ports=tuple(ports.values()))
            ledger.reserve(holding, best.cost)
            return Outcome(placement=placement)
        assert refused is not None
        return _unplaced(task, refused)
    assert unplaced is not None
    if preempt and unplaced.reason in CAPACITY_REASONS:
        return _preempt(ev, ledger, task, unplaced, found)
    return Outcome(unplaced=unplaced)


def _search(
    ev: Evaluation, ledger: Ledger, task: PendingTask, quota: Quota | None
) -> tuple[Search, Unplaced | None]:
    """The search for `task`, and its explanation when nothing fits."""
    shape: ShapeKey = (
        task.requirement,
        task.tenant_id,
        task.excluded_node_ids,
        task.required_min_vram_mb,
        task.same_node_id,
        task.pools,
        task.surge_cards,
    )
    miss = ev.misses.get(shape)
    if miss is not None and miss[0] == ledger.version:
        _, found, why = miss
        return found, replace(why, task_id=task.task_id)
    found = search(ev.index, ledger, task, quota, ev.max_candidates)
    if found.fits:
        return found, None
    why = explain(ev, ledger, task, found, quota)
    ev.misses[shape] = (ledger.version, found, why)
    return found, why


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
        queue=task.queue,
        job=task.job,
    )


# --- host ports ----------------------------------------------------------------------


def ports_wanted(task: PendingTask, node: Node) -> dict[str, int]:
    """The host ports `task` needs on `node`, by name: 0 = any free one, else that one."""
    wanted: dict[str, int] = {}
    if task.master_port is not None:
        wanted["master"] = task.master_port
    if task.serves and (task.host_network or node.runtime == "process"):
        wanted["serve"] = 0  # no port mapping there: the replica listens on the host's port
    return wanted


def host_ports(ev: Evaluation, ledger: Ledger, node: Node) -> set[int]:
    """Ports held on `node`'s host: by every task placed on a node of that host."""
    return {
        p for nid in ev.nodes_on(node.host) or (node.id,) for a in ledger.on(nid) for p in a.ports
    }


def allocate_ports(
    ev: Evaluation, ledger: Ledger, task: PendingTask, node: Node
) -> dict[str, int] | Verdict:
    """The ports `task` gets on `node`'s host, or why it cannot have them (PORT_TAKEN).

    A free port is found from a start derived from the task id (deterministic, and spread
    so a port just released is not the next one handed out), probing up the node's range."""
    wanted = ports_wanted(task, node)
    if not wanted:
        return {}
    used = host_ports(ev, ledger, node)
    lo, hi = node.port_range
    out: dict[str, int] = {}
    for name, pinned in sorted(wanted.items()):
        if pinned:
            if pinned in used:
                return reject(
                    Reason.PORT_TAKEN,
                    f"master_port {pinned} is held on the host of node {node.id!r} by another "
                    "task; unset master_port to have one allocated",
                )
            port: int | None = pinned
        else:
            port = _free_port(lo, hi, used, f"{task.task_id}/{name}")
        if port is None:
            return reject(
                Reason.PORT_TAKEN,
                f"every port of {lo}-{hi} (HETEROFLOW_PORT_RANGE) is held on the host of node "
                f"{node.id!r}",
            )
        out[name] = port
        used.add(port)
    return out


def _free_port(lo: int, hi: int, used: set[int], seed: str) -> int | None:
    size = hi - lo + 1
    if size <= 0:
        return None
    start = zlib.crc32(seed.encode()) % size
    for i in range(size):
        port = lo + (start + i) % size
        if port not in used:
            return port
    return None


# --- why not -------------------------------------------------------------------------

_STAGE_RANK: dict[Reason, int] = {r: i for i, r in enumerate(NODE_STAGE_ORDER)}


def explain(
    ev: Evaluation, ledger: Ledger, task: PendingTask, found: Search, quota: Quota | None
) -> Unplaced:
    """Report the node that got furthest through the stage chain (the "closest" one).

    Ties go to the first node by id. Its message comes from checking it again in full.
    Cluster-wide phrasing replaces the node's message where it is more useful, and a tally
    of every node's reason is appended.
    """
    counts = tally(ev.index, ledger, found)
    reason = max(counts.counts, key=lambda r: _STAGE_RANK[r])
    node = ev.nodes[counts.first[reason]]
    closest, _ = check_node(task, node, ledger.usage_on(node.id), quota=quota)
    reason = closest.reason or reason
    message = closest.message
    wanted = task.requirement.gpu_type
    if reason is Reason.GPU_TYPE_UNAVAILABLE and not ev.index.any_online_of_type(wanted):
        message = f"no online node has GPU type {wanted!r}"
    elif reason is Reason.PINNED_ELSEWHERE:
        message = _pin_message(ev, task)
    elif reason is Reason.NODE_OFFLINE and not task.pins:
        message = "every node is offline"
    if counts.total > 1:
        message += f" [{_tally_text(counts)}]"
    if task.pools and reason in CAPACITY_REASONS:
        full = pool_full(task, message)
        assert full.reason is not None
        return Unplaced(task.task_id, full.reason, full.message)
    return Unplaced(task.task_id, reason, message)


def _pin_message(ev: Evaluation, task: PendingTask) -> str:
    missing = [p for p in task.pins if p not in ev.index.position]
    if missing:
        return f"task is pinned to node {missing[0]!r}, which is not in the cluster"
    return f"task is pinned to nodes {' and '.join(map(repr, task.pins))}; no node is both"


def _tally_text(counts: Tally) -> str:
    ordered = sorted(counts.counts.items(), key=lambda c: (-c[1], c[0].value))
    parts = ", ".join(f"{n} {r.value}" for r, n in ordered)
    return f"{counts.total} nodes checked: {parts}"


# --- preemption ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Option:
    node: Node
    victims: tuple[Allocation, ...]  # empty: capacity is already on its way out, just wait
    fit: Fit


def _preempt(
    ev: Evaluation, ledger: Ledger, task: PendingTask, unplaced: Unplaced, found: Search
) -> Outcome:
    # Only nodes holding preemptible or leaving work can offer anything: look at those.
    options = [
        opt
        for pos in sorted(ledger.evictable)
        if reason_at(ev.index, ledger, found, pos) in CAPACITY_REASONS
        and (opt := _option_on(ev, ledger, task, ev.nodes[pos])) is not None
    ]
    waiting = [o for o in options if not o.victims]
    if waiting:
        note = f"; waiting for capacity being released on node {waiting[0].node.id!r}"
        return Outcome(unplaced=replace(unplaced, message=unplaced.message + note))
    if not options:
        return Outcome(unplaced=unplaced)
    shuffled = seeded_shuffle(options, task.task_id, key=lambda o: o.node.id)
    best = min(shuffled, key=_victim_cost)
    victims = tuple(a.task_id for a in best.victims)
    ledger.mark_leaving(best.node.id, frozenset(victims))
    # Hold the freed capacity for this task so nobody else in the round takes it.
    ledger.reserve(_holding(task, best.fit), best.fit.cost)
    note = f"; preempting {len(victims)} lower-priority task(s) on node {best.node.id!r}"
    return Outcome(
        unplaced=replace(unplaced, message=unplaced.message + note),
        preemption=Preemption(task.task_id, best.node.id, victims),
    )


def _outranks(ev: Evaluation, task: PendingTask, victim: Allocation) -> bool:
    """Queue priority first, then task priority (seed 004)."""
    queue = ev.snapshot.queues.get(victim.queue) if victim.queue else None
    victim_rank = (queue.priority if queue else 0, victim.priority)
    return (task.queue_priority, task.priority) > victim_rank


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
        (a for a in allocs if a.status not in LEAVING and a.preemptible and _outranks(ev, task, a)),
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
    quota = ev.quota(ledger, task.tenant_id, task.surge_cards)
    if quota is not None:
        refund = sum(allocation_cost(a, ev.gpus) for a in removed if a.tenant_id == task.tenant_id)
        quota = replace(quota, used=quota.used - refund)
    _, fit = check_node(task, node, usage_of(rest), quota=quota)
    return fit


# --- gangs ---------------------------------------------------------------------------


def place_gang(ev: Evaluation, ledger: Ledger, members: Sequence[PendingTask]) -> list[Outcome]:
    """All members placed in this round, or none (GANG_INCOMPLETE). Gangs never preempt."""
    gang = members[0].gang_id
    expected = max(m.gang_size for m in members)
    if expected > len(members):
        msg = f"gang {gang!r}: only {len(members)} of {expected} members are pending"
        return [_gang_incomplete(m, msg) for m in members]
    mark = ledger.checkpoint()
    placed = _place_all(ev, ledger, members)
    if not _spans_hosts_with_loopback(ev, placed):
        return placed
    # Its members reach each other at their nodes' addresses: a node that advertises only
    # loopback can hold members only when every other member is on its host. Try again
    # without such nodes.
    ledger.rollback(mark)
    loopback = frozenset(n.id for n in ev.nodes if n.host_id and is_loopback(n.address))
    again = _place_all(
        ev, ledger, [replace(m, excluded_node_ids=m.excluded_node_ids | loopback) for m in members]
    )
    if all(o.placement is not None for o in again):
        return again
    ledger.rollback(mark)
    first = [o.placement.node_id for o in placed if o.placement is not None]
    names = sorted(n for n in set(first) if n in loopback)
    msg = (
        f"gang {gang!r} would span hosts and node(s) {', '.join(map(repr, names))} advertise "
        "only a loopback address (set HETEROFLOW_ADDRESS on their agents); without them it "
        "does not fit"
    )
    return [Outcome(unplaced=Unplaced(m.task_id, Reason.LOOPBACK_ADDRESS, msg)) for m in members]


def _place_all(ev: Evaluation, ledger: Ledger, members: Sequence[PendingTask]) -> list[Outcome]:
    """Every member placed (reserved in `ledger`), or the first that fails and the others
    incomplete, with the ledger rolled back."""
    gang = members[0].gang_id
    mark = ledger.checkpoint()
    placed: list[Outcome] = []
    for member in members:
        outcome = schedule_task(ev, ledger, member, preempt=False)
        if outcome.placement is None:
            ledger.rollback(mark)
            assert outcome.unplaced is not None
            why = outcome.unplaced
            msg = (
                f"gang {gang!r} is placed whole or not at all; member {member.task_id!r} "
                f"cannot be placed ({why.reason.value}: {why.message})"
            )
            others = [_gang_incomplete(m, msg) for m in members if m is not member]
            return [outcome, *others]
        placed.append(outcome)
    return placed


def _spans_hosts_with_loopback(ev: Evaluation, placed: Sequence[Outcome]) -> bool:
    """Placed on nodes of more than one known host, one of them advertising loopback."""
    nodes = [ev.node(o.placement.node_id) for o in placed if o.placement is not None]
    if len(nodes) < 2 or any(n is None or not n.host_id for n in nodes):
        return False  # a node without a reported host id: its host is unknown
    known = [n for n in nodes if n is not None]
    return len({n.host for n in known}) > 1 and any(is_loopback(n.address) for n in known)


def _gang_incomplete(task: PendingTask, message: str) -> Outcome:
    return Outcome(unplaced=Unplaced(task.task_id, Reason.GANG_INCOMPLETE, message))


# --- variants (variants.py, docs/scheduling.md#variants) ------------------------------


def _schedule_one(
    ev: Evaluation, ledger: Ledger, task: PendingTask, group_variants: dict[str, int]
) -> Outcome:
    """A task that is no gang member, with preemption; a group's member is held to the
    variant its group runs (`pin_to_group`), and a placement it gets is recorded for the
    group's next members in this evaluation."""
    outcome = schedule_variants(ev, ledger, pin_to_group(task, group_variants), preempt=True)
    placed = outcome.placement
    if placed is not None and placed.variant is not None and task.variant_group:
        group_variants.setdefault(task.variant_group, placed.variant)
    return outcome


def schedule_variants(
    ev: Evaluation, ledger: Ledger, task: PendingTask, *, preempt: bool
) -> Outcome:
    """`schedule_task` for a task with variants: the first considered variant that fits,
    else every considered variant's refusal; preemption is asked for the first variant
    refused for capacity alone. A task without variants goes to `schedule_task` as it is."""
    if not task.variants:
        return schedule_task(ev, ledger, task, preempt=preempt)
    opening = open_variants(task, ev.snapshot.now)
    tried: list[tuple[Variant, Unplaced]] = []
    for var in opening.considered:
        out = schedule_task(ev, ledger, as_variant(task, var), preempt=False)
        if out.placement is not None:
            return Outcome(placement=replace(out.placement, variant=var.index))
        assert out.unplaced is not None
        tried.append((var, out.unplaced))
    why = refused(task.task_id, tried, opening)
    for var, un in tried if preempt else ():
        if un.reason not in CAPACITY_REASONS:
            continue
        out = schedule_task(ev, ledger, as_variant(task, var), preempt=True)
        if out.preemption is not None and out.unplaced is not None:
            note = out.unplaced.message.removeprefix(un.message).lstrip("; ")
            message = f"{why.message}; for variants[{var.index}]: {note}"
            return Outcome(unplaced=replace(why, message=message), preemption=out.preemption)
    return Outcome(unplaced=why)


def place_gang_variants(
    ev: Evaluation, ledger: Ledger, members: Sequence[PendingTask]
) -> list[Outcome]:
    """`place_gang` once per considered variant, in order: every member runs the same one
    (a static world is one vendor). The variants considered are its first member's."""
    if not members[0].variants:
        return place_gang(ev, ledger, members)
    members = [pin_to_group(m, {}) for m in members]  # a member's group may run one already
    opening = open_variants(members[0], ev.snapshot.now)
    tried: list[tuple[Variant, dict[str, Unplaced]]] = []
    for var in opening.considered:
        outs = place_gang(ev, ledger, [as_variant(m, var) for m in members])
        if all(o.placement is not None for o in outs):
            return [
                Outcome(placement=replace(o.placement, variant=var.index))
                for o in outs
                if o.placement
            ]
        tried.append((var, {o.unplaced.task_id: o.unplaced for o in outs if o.unplaced}))
    return [
        Outcome(unplaced=refused(m.task_id, [(v, by[m.task_id]) for v, by in tried], opening))
        for m in members
    ]
