"""The working copy of what holds resources during one evaluation.

Each placement is reserved here before the next task is looked at. The ledger also keeps
every node in a bucket by its free whole cards, per node class, so the planner walks only
nodes that can hold a request, best-packed first. It is the one mutable thing in an
evaluation: it never leaves `planner.plan`, and `checkpoint`/`rollback` undo a gang that
could not be placed whole. Updating one node costs the same on a 10-node and a 10,000-node
cluster (copying the whole ledger per placement did not).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from libs.domain.task.states import TaskStatus

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
        self.tenant_used: dict[str, float] = {}
        self.queue_use: dict[str, QueueUse] = {}
        grouped: dict[str, list[Allocation]] = {}
        holders = [a for a in allocations if a.holding]
        lenders = {a.task_id for a in holders if a.status is TaskStatus.SLEEPING}
        for a in holders:
            grouped.setdefault(a.node_id, []).append(a)
            # A borrower runs on its sleeping lender's card: the quota counts that card once.
            cost = 0.0 if a.borrowed_from in lenders else allocation_cost(a, gpus)
            self.tenant_used[a.tenant_id] = self.tenant_used.get(a.tenant_id, 0.0) + cost
            if a.queue:
                self.queue_use.setdefault(a.queue, QueueUse()).add(a, cost)
        self.by_node: dict[str, tuple[Allocation, ...]] = {
            n: tuple(allocs) for n, allocs in grouped.items()
        }
        self.usage: dict[str, NodeUsage] = {}
        self.key_of: list[int] = [h or FULL for h in index.healthy]  # idle nodes
        # Nodes holding work that preemption could remove or that is already leaving.
        self.evictable: set[int] = set()
        for node_id, held in self.by_node.items():
            pos = index.position.get(node_id)
            self.usage[node_id], key = _usage_and_key(index, node_id, pos, held)
            if pos is not None:
                self.key_of[pos] = key
                if _may_be_evicted(held):
                    self.evictable.add(pos)
        self.buckets: list[dict[int, list[int]]] = [{} for _ in index.classes]
        for pos, key in enumerate(self.key_of):  # ascending positions: lists stay sorted
            self.buckets[index.class_of[pos]].setdefault(key, []).append(pos)
        self._versions = itertools.count(1)
        self.version = 0  # a new number for every state, rollbacks included
        self._journal: list[_Undo] = []

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
        old, new = self.key_of[pos], bucket_key(self.index.nodes[pos], self.usage[node_id])
        if old == new:
            return
        buckets = self.buckets[self.index.class_of[pos]]
        was = buckets[old]
        del was[bisect.bisect_left(was, pos)]
        if not was:
            del buckets[old]
        bisect.insort(buckets.setdefault(new, []), pos)
        self.key_of[pos] = new
