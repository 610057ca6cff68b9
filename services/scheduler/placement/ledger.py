"""The working copy of what holds resources during one evaluation.

Each placement is reserved here before the next task is looked at. The ledger also keeps
every node in a bucket by its free whole cards, per node class, so the planner walks only
nodes that can hold a request, best-packed first. It is the one mutable thing in an
evaluation: it never leaves the `Planner` that plans with it, and `checkpoint`/`rollback`
undo a gang that could not be placed whole. Updating one node costs the same on a 10-node
and a 10,000-node cluster (copying the whole ledger per placement did not).

Between evaluations the planner keeps its ledger and `update`s it to the next snapshot's
allocations: the round's reservations are rolled back and only the tasks whose allocation
changed are moved. When the snapshot says what changed since the one the ledger was brought
to (`AllocationDelta`, from the scheduler's cluster view), `apply` moves those without
scanning the rest, so a round costs what changed rather than what is held. The result equals
a ledger built from the same allocations (tests/unit/test_ledger_incremental.py): each node's
allocations are kept in task-id order and sums of costs are exactly rounded (`math.fsum`), so
neither depends on the order in which tasks came or went.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TypeVar

from libs.domain.task.states import GPU_HOLDING, TaskStatus

from .feasibility import CardUse, NodeUsage, allocation_cost, free_whole_cards, usage_of
from .index import ClusterIndex
from .model import Allocation, Gpu, Node
from .queues import QueueUse

# Holding statuses on their way out: their capacity frees without anybody's help.
LEAVING: frozenset[TaskStatus] = frozenset(
    {TaskStatus.STOPPING, TaskStatus.DRAINING, TaskStatus.PREEMPTING}
)
# Bucket of a node with no free whole card and no shared card: no GPU request fits there.
FULL = -1

_IDLE = NodeUsage()
_T = TypeVar("_T")


def bucket_key(node: Node, usage: NodeUsage) -> int:
    """Free whole cards; with none, 0 if a shared card has room left (a fraction may still
    fit there) or FULL. Ascending keys are ascending "free whole cards left", the bin-pack's
    first key."""
    free = free_whole_cards(node, usage)
    if free:
        return free
    return 0 if any(_has_room(g, usage.cards.get(g.id)) for g in node.gpus) else FULL


def _has_room(gpu: Gpu, use: CardUse | None) -> bool:
    """Whether any fraction could join this card. A fraction holds at least 1 MB and at
    least 1/vram_mb of compute (model.share_on), so a card with no VRAM or no compute
    left takes none."""
    if use is None or use.whole or gpu.excluded:
        return False
    return use.vram_mb < gpu.vram_mb and use.compute_ratio < 1.0


def _may_be_evicted(allocs: Iterable[Allocation]) -> bool:
    return any(a.preemptible or a.status in LEAVING for a in allocs)


def _usage_and_key(
    index: ClusterIndex, node_id: str, pos: int | None, held: tuple[Allocation, ...]
) -> tuple[NodeUsage, int]:
    """Usage and bucket of a node, from the index's memo while its allocations are the same
    as last evaluation (most nodes, round after round)."""
    hit = index.usage_memo.get(node_id)
    if hit is not None and hit[0] == held:
        return hit[1], hit[2]
    usage = usage_of(held)
    key = bucket_key(index.nodes[pos], usage) if pos is not None else FULL
    index.usage_memo[node_id] = (held, usage, key)
    return usage, key


@dataclass(frozen=True, slots=True)
class _Undo:
    node_id: str
    allocs: tuple[Allocation, ...]
    tenant_id: str = ""
    tenant_used: float | None = None
    queue: str = ""
    queue_was: tuple[float, int, str, int] | None = None  # cards, tasks, job, job's tasks


class Ledger:
    """Allocations and usage by node, quota used by tenant and by queue, and the free-card
    buckets."""

    def __init__(
        self, index: ClusterIndex, allocations: Iterable[Allocation], gpus: Mapping[str, Gpu]
    ) -> None:
        self.index = index
        self.gpus = gpus
        self.tenant_used: dict[str, float] = {}
        self.queue_use: dict[str, QueueUse] = {}
        self.by_node: dict[str, tuple[Allocation, ...]] = {}
        self.usage: dict[str, NodeUsage] = {}
        self.key_of: list[int] = [h or FULL for h in index.healthy]  # idle nodes
        # Nodes holding work that preemption could remove or that is already leaving.
        self.evictable: set[int] = set()
        # The snapshot's holders (the state `update` starts from), by task, and what each
        # counts for: cost by tenant, (cost, job) by queue, allocations by node.
        self._held: dict[str, Allocation] = {a.task_id: a for a in allocations if a.holding}
        self._costs: dict[str, dict[str, float]] = {}
        self._queued: dict[str, dict[str, tuple[float, str]]] = {}
        self._members: dict[str, dict[str, Allocation]] = {}
        self._load(gpus)
        self._sum(self._costs, self._queued)
        self.buckets: list[dict[int, list[int]]] = [{} for _ in index.classes]
        for pos, key in enumerate(self.key_of):  # ascending positions: lists stay sorted
            self.buckets[index.class_of[pos]].setdefault(key, []).append(pos)
        self._versions = itertools.count(1)
        self.version = 0  # a new number for every state, rollbacks included
        self._journal: list[_Undo] = []
        # The allocations (the snapshot's tuple itself) this ledger was last brought to: a
        # delta from exactly those may be applied instead of a full `update` (planner.py).
        self.synced: object = None

    def _load(self, gpus: Mapping[str, Gpu]) -> None:
        """The first state, from `_held`: `_add` and `_base` for every holder and node, inline
        (a full build is the fallback of `update`, and the ledger of a one-off evaluation)."""
        held, costs, queued, members = self._held, self._costs, self._queued, self._members
        lenders = {t for t, a in held.items() if a.status is TaskStatus.SLEEPING}
        for task_id, a in held.items():
            # A borrower runs on its sleeping lender's card: the quota counts that card once.
            cost = 0.0 if a.borrowed_from in lenders else allocation_cost(a, gpus)
            if (by_task := costs.get(a.tenant_id)) is None:
                by_task = costs[a.tenant_id] = {}
            by_task[task_id] = cost
            if a.queue:
                queued.setdefault(a.queue, {})[task_id] = (cost, a.job_key)
            if (on := members.get(a.node_id)) is None:
                on = members[a.node_id] = {}
            on[task_id] = a
        index, position = self.index, self.index.position
        for node_id, on in members.items():
            allocs = tuple(on.values()) if len(on) == 1 else tuple(on[t] for t in sorted(on))
            pos = position.get(node_id)
            self.by_node[node_id] = allocs
            self.usage[node_id], key = _usage_and_key(index, node_id, pos, allocs)
            if pos is not None:
                self.key_of[pos] = key
                if _may_be_evicted(allocs):
                    self.evictable.add(pos)

    def update(self, allocations: Iterable[Allocation]) -> bool:
        """Become the ledger of `allocations` (this evaluation's reservations undone first),
        moving only the tasks whose allocation changed. False where it cannot: a change
        touches card lending (a borrower's cost depends on its lender's status), or two
        allocations name one task; the caller then builds a new ledger."""
        # Back to the snapshot's state. A node, tenant or queue that only a reservation had
        # added stays, holding nothing: the same to every reader as no entry.
        self.rollback(0)
        # Comprehensions: this scan runs over every allocation (see `apply` for the delta).
        hold = [a for a in allocations if a.status in GPU_HOLDING]
        holders = {a.task_id: a for a in hold}
        if len(hold) != len(holders):
            return False
        kept = self._held.get
        changed = [a for t, a in holders.items() if kept(t) is not a and kept(t) != a]
        gone = [self._held[t] for t in self._held.keys() - holders.keys()]
        return self._move_to(changed, gone)

    def apply(self, changed: Iterable[Allocation], gone: Iterable[str]) -> bool:
        """`update` to the snapshot that differs from the last one this ledger was brought to
        only in `changed` (allocations new or moved; one no longer holding counts as gone)
        and `gone` (tasks that hold nothing now): the same ledger, at the cost of what
        changed instead of what is held (ClusterView's `AllocationDelta`). False where
        `update` would be, and for two allocations of one task."""
        self.rollback(0)
        kept = self._held.get
        moved: dict[str, Allocation] = {}
        leaving = set(gone)
        for a in changed:
            if a.task_id in moved or a.task_id in leaving:
                return False
            if a.status in GPU_HOLDING:
                moved[a.task_id] = a
            else:
                leaving.add(a.task_id)
        news = [a for t, a in moved.items() if kept(t) is not a and kept(t) != a]
        return self._move_to(news, [self._held[t] for t in leaving if t in self._held])

    def _move_to(self, changed: list[Allocation], gone: list[Allocation]) -> bool:
        """Move `changed` (new allocations) in and `gone` (kept ones) out; False, with
        nothing moved, where one touches card lending."""
        kept = self._held.get
        for a in changed:
            old = kept(a.task_id)
            if _lends(a) or (old is not None and _lends(old)):
                return False
        if any(_lends(a) for a in gone):
            return False
        nodes: set[str] = set()
        tenants = {a.tenant_id for a in gone}
        queues = {a.queue for a in gone if a.queue}
        for a in gone:
            self._remove(a)
            nodes.add(a.node_id)
        for a in changed:
            old = self._held.get(a.task_id)
            if old is not None:
                self._remove(old)
                nodes.add(old.node_id)
                tenants.add(old.tenant_id)
                if old.queue:
                    queues.add(old.queue)
            self._add(a, allocation_cost(a, self.gpus))
            nodes.add(a.node_id)
            tenants.add(a.tenant_id)
            if a.queue:
                queues.add(a.queue)
        for node_id in nodes:
            pos, key = self._base(node_id)
            if pos is not None:
                self._move(pos, key)
        self._sum(
            {t: self._costs.get(t, {}) for t in tenants},
            {q: self._queued.get(q, {}) for q in queues},
        )
        self.version = next(self._versions)
        return True

    def _add(self, a: Allocation, cost: float) -> None:
        self._held[a.task_id] = a
        self._costs.setdefault(a.tenant_id, {})[a.task_id] = cost
        if a.queue:
            self._queued.setdefault(a.queue, {})[a.task_id] = (cost, a.job_key)
        self._members.setdefault(a.node_id, {})[a.task_id] = a

    def _remove(self, a: Allocation) -> None:
        del self._held[a.task_id]
        _drop(self._costs, a.tenant_id, a.task_id)
        if a.queue:
            _drop(self._queued, a.queue, a.task_id)
        _drop(self._members, a.node_id, a.task_id)

    def _base(self, node_id: str) -> tuple[int | None, int]:
        """A node's allocations, usage and evictability as its holders make them; its
        position and bucket key (the caller files it)."""
        members = self._members.get(node_id)
        held = tuple(members[t] for t in sorted(members)) if members else ()
        pos = self.index.position.get(node_id)
        if held:
            self.by_node[node_id] = held
            self.usage[node_id], key = _usage_and_key(self.index, node_id, pos, held)
        else:
            self.by_node.pop(node_id, None)
            self.usage.pop(node_id, None)
            key = (self.index.healthy[pos] or FULL) if pos is not None else FULL
        if pos is not None:  # else work on a node the snapshot does not list: quota only
            if _may_be_evicted(held):
                self.evictable.add(pos)
            else:
                self.evictable.discard(pos)
        return pos, key

    def _sum(
        self,
        costs: Mapping[str, Mapping[str, float]],
        queued: Mapping[str, Mapping[str, tuple[float, str]]],
    ) -> None:
        for tenant, by_task in costs.items():
            if by_task:
                self.tenant_used[tenant] = math.fsum(by_task.values())
            else:
                self.tenant_used.pop(tenant, None)
        for queue, entries in queued.items():
            if not entries:
                self.queue_use.pop(queue, None)
                continue
            use = QueueUse(math.fsum(c for c, _ in entries.values()), len(entries))
            for _, job in entries.values():
                use.jobs[job] = use.jobs.get(job, 0) + 1
            self.queue_use[queue] = use

    def on(self, node_id: str) -> tuple[Allocation, ...]:
        return self.by_node.get(node_id, ())

    def usage_on(self, node_id: str) -> NodeUsage:
        return self.usage.get(node_id, _IDLE)

    # --- changes -------------------------------------------------------------------------

    def reserve(self, alloc: Allocation, cost: float) -> None:
        used = self.tenant_used.get(alloc.tenant_id, 0.0)
        queue_was = None
        if alloc.queue:
            q = self.queue_use.setdefault(alloc.queue, QueueUse())
            queue_was = (q.gpus, q.tasks, alloc.job_key, q.jobs.get(alloc.job_key, 0))
            q.add(alloc, cost)
        undo = _Undo(alloc.node_id, self.on(alloc.node_id), alloc.tenant_id, used)
        self._journal.append(replace(undo, queue=alloc.queue, queue_was=queue_was))
        self.tenant_used[alloc.tenant_id] = used + cost
        self._set(alloc.node_id, (*self.on(alloc.node_id), alloc))

    def mark_leaving(self, node_id: str, task_ids: frozenset[str]) -> None:
        """Victims turn `preempting`: they still hold (and count) until they are gone."""
        allocs = self.on(node_id)
        self._journal.append(_Undo(node_id, allocs))
        moved = tuple(
            replace(a, status=TaskStatus.PREEMPTING) if a.task_id in task_ids else a for a in allocs
        )
        self._set(node_id, moved)

    def checkpoint(self) -> int:
        return len(self._journal)

    def rollback(self, mark: int) -> None:
        """Undo every change made since `checkpoint()` returned `mark`."""
        while len(self._journal) > mark:
            undo = self._journal.pop()
            if undo.tenant_used is not None:
                self.tenant_used[undo.tenant_id] = undo.tenant_used
            if undo.queue_was is not None:
                self._queue_undo(undo.queue, undo.queue_was)
            self._set(undo.node_id, undo.allocs)

    def _queue_undo(self, queue: str, was: tuple[float, int, str, int]) -> None:
        q = self.queue_use[queue]
        q.gpus, q.tasks, job, count = was
        if count:
            q.jobs[job] = count
        else:
            q.jobs.pop(job, None)

    def _set(self, node_id: str, allocs: tuple[Allocation, ...]) -> None:
        self.version = next(self._versions)
        self.by_node[node_id] = allocs
        self.usage[node_id] = usage_of(allocs)
        pos = self.index.position.get(node_id)
        if pos is None:
            return  # work on a node the snapshot does not list: counts for quota only
        if _may_be_evicted(allocs):
            self.evictable.add(pos)
        else:
            self.evictable.discard(pos)
        self._move(pos, bucket_key(self.index.nodes[pos], self.usage[node_id]))

    def _move(self, pos: int, new: int) -> None:
        old = self.key_of[pos]
        if old == new:
            return
        buckets = self.buckets[self.index.class_of[pos]]
        was = buckets[old]
        del was[bisect.bisect_left(was, pos)]
        if not was:
            del buckets[old]
        bisect.insort(buckets.setdefault(new, []), pos)
        self.key_of[pos] = new


def _lends(a: Allocation) -> bool:
    return a.status is TaskStatus.SLEEPING or bool(a.borrowed_from)


def _drop(groups: dict[str, dict[str, _T]], key: str, task_id: str) -> None:
    group = groups[key]
    del group[task_id]
    if not group:
        del groups[key]
