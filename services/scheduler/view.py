"""The scheduler's view of the cluster, read from the projections.

Nodes and GPU-holding tasks become a `ClusterSnapshot`; pending tasks become `PendingTask`s.
Reading the projections each round keeps the view exactly what the store says (the scheduler
holds no state a crash could lose); the queries use the partial index on pending tasks.
`ClusterView` reads the same rows but parses again only those whose version moved, so a round
on a large fleet costs what changed, not what exists; `PendingQueue` does the same for the
pending queue.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from libs.domain.node.model import Node as NodeDoc
from libs.domain.node.model import NodeStatus
from libs.domain.pool.model import NodeSelector, Pool, Queue, QueuePolicy
from libs.domain.task.model import Task
from libs.domain.task.states import GPU_HOLDING
from libs.domain.task.variants import placed_spec
from libs.store import groups as group_rows
from libs.store import nodes as node_rows
from libs.store import pools as pool_rows
from libs.store import queues as queue_rows
from libs.store import tasks as task_rows
from libs.store import tenants
from libs.store.eventstore import EventStore

from .placement.model import (
    Allocation,
    AllocationDelta,
    ClusterSnapshot,
    Gpu,
    Node,
    PendingTask,
    QueueLimits,
)

# The longest a view goes without listing nodes and holding tasks again while rounds run.
RELIST_S = 1.0


def to_node(doc: NodeDoc, max_starting: int = 0) -> Node:
    """The planner's node; `max_starting` is the scheduler's bound on its in-flight starts."""
    inv = doc.inventory
    # A lost card and a quarantined one (a device fault) take no new placement alike.
    excluded = {*doc.excluded_gpus, *(q.gpu_id for q in doc.quarantined_gpus)}
    return Node(
        id=doc.id,
        online=doc.status is NodeStatus.ONLINE,
        memory_mb=inv.memory_mb,
        cpu_cores=inv.cpu_cores,
        gpus=tuple(
            Gpu(
                id=g.id,
                index=g.index,
                vendor=g.vendor,
                model=g.model,
                vram_mb=g.vram_mb,
                mig_capable=g.mig_capable,
                mig_enabled=g.mig_enabled,
                excluded=g.id in excluded,
            )
            for g in inv.gpus
        ),
        labels=dict(inv.labels),
        runtime=inv.runtime,
        max_starting=max_starting,
        address=inv.address,
        host_id=inv.host_id,
        port_range=inv.port_range,
    )


async def load_nodes(store: EventStore, ids: Sequence[str] | None = None) -> list[NodeDoc]:
    """Every node, or only those named by `ids`."""
    return await node_rows.all_nodes(store) if ids is None else await node_rows.by_ids(store, ids)


async def load_holding(store: EventStore) -> list[Task]:
    return await task_rows.holding(store)


async def load_pending(store: EventStore, limit: int) -> list[Task]:
    return await task_rows.pending(store, limit)


class PendingQueue:
    """The scheduler's pending queue, each task parsed once per version.

    Every round lists the queue (`tasks.pending_since`) but is sent only the documents that
    are new or moved since the last round; a task still pending at the same version is the
    model parsed before (a `Task` is immutable). What left the queue is dropped at each
    listing, so the cache never holds more than one batch."""

    def __init__(self) -> None:
        self._parsed: dict[str, Task] = {}
        self.parsed_last = 0  # documents the last `load` parsed (tests and benchmarks)
        # Task id -> ((version, gang, variant pin), the planner's PendingTask built from them).
        self._planned: dict[str, tuple[tuple[int, Gang | None, int | None], PendingTask]] = {}

    async def load(self, store: EventStore, limit: int) -> list[Task]:
        known = {i: t.version for i, t in self._parsed.items()}
        listed = await task_rows.pending_since(store, limit, known)
        kept: dict[str, Task] = {}
        out: list[Task] = []
        parsed = 0
        for task_id, doc in listed:
            if doc is None:  # sent without its document: the version `known` gave for it
                task = self._parsed[task_id]
            else:
                task = Task.model_validate_json(doc)
                parsed += 1
            kept[task_id] = task
            out.append(task)
        self._parsed = kept
        self.parsed_last = parsed
        self._planned = {i: p for i, p in self._planned.items() if i in kept}
        return out

    def pendings(
        self,
        tasks: Sequence[Task],
        gangs: dict[str, Gang] | None = None,
        group_variants: dict[str, int] | None = None,
    ) -> list[PendingTask]:
        """`pending_of` each task, built again only when the task or its group's gang or
        variant moved since the round before."""
        gangs, group_variants = gangs or {}, group_variants or {}
        out: list[PendingTask] = []
        for t in tasks:
            key = (t.version, gangs.get(t.group_id or ""), group_variants.get(t.group_id or ""))
            kept = self._planned.get(t.id)
            if kept is None or kept[0] != key:
                kept = (key, pending_of(t, gangs, group_variants))
                self._planned[t.id] = kept
            out.append(kept[1])
        return out


async def load_quotas(store: EventStore) -> dict[str, float]:
    return await tenants.gpu_quotas(store)


Selectors = dict[str, NodeSelector]


async def load_admission(store: EventStore) -> tuple[dict[str, QueueLimits], Selectors]:
    """Live queues as admission sees them, and the selector of every live pool."""
    pools, queues = await asyncio.gather(pool_rows.live(store), queue_rows.live(store))
    return {q.spec.name: limits_of(q) for q in queues}, selectors(pools)


def selectors(pools: Iterable[Pool]) -> Selectors:
    return {p.spec.name: p.spec.node_selector for p in pools}


def limits_of(queue: Queue) -> QueueLimits:
    spec = queue.spec
    return QueueLimits(
        name=spec.name,
        pools=frozenset(spec.pools),
        max_gpus=spec.quota.max_gpus,
        max_running_jobs=spec.quota.max_running_jobs,
        max_running_tasks=spec.quota.max_running_tasks,
        priority=spec.priority,
        fifo=spec.policy is QueuePolicy.FIFO,
    )


def tag_pools(nodes: tuple[Node, ...], pools: Selectors) -> tuple[Node, ...]:
    """Each node with the names of the pools whose selector it matches."""
    if not pools and not any(n.pools for n in nodes):
        return nodes
    return tuple(
        replace(
            n,
            pools=frozenset(
                name
                for name, sel in pools.items()
                if sel.matches(n.labels, ((g.vendor, g.model) for g in n.gpus))
            ),
        )
        for n in nodes
    )


def snapshot(
    now: datetime,
    nodes: Sequence[NodeDoc],
    holding: Sequence[Task],
    quotas: dict[str, float],
    queues: dict[str, QueueLimits] | None = None,
    pools: Selectors | None = None,
) -> ClusterSnapshot:
    sched_nodes = tag_pools(tuple(to_node(n) for n in nodes), pools or {})
    gpus = {g.id: g for n in sched_nodes for g in n.gpus}
    return ClusterSnapshot(
        now=now,
        nodes=sched_nodes,
        allocations=tuple(Allocation.from_task(t, gpus) for t in holding if t.node_id),
        tenant_quotas=quotas,
        queues=queues or {},
    )


@dataclass(frozen=True, slots=True)
class Gang:
    """A static-world group as placement sees it: its world size and its pinned port."""

    size: int
    master_port: int | None = None


async def load_gangs(store: EventStore, tasks: Sequence[Task]) -> dict[str, Gang]:
    """Static-world groups among the pending tasks' groups, by group id."""
    ids = sorted({t.group_id for t in tasks if t.group_id})
    if not ids:
        return {}
    return {
        g.id: Gang(g.spec.shape.task_count, g.spec.shape.master_port)
        for g in await group_rows.by_ids(store, ids)
        if g.spec.static_world
    }


async def load_group_variants(store: EventStore, tasks: Sequence[Task]) -> dict[str, int]:
    """The variant each group of the pending tasks with variants runs, by group id: that of
    a member holding a placement (docs/groups.md: every member runs the same variant)."""
    ids = sorted({t.group_id for t in tasks if t.group_id and t.spec.variants})
    out: dict[str, int] = {}
    for group_id in ids:
        for member in await task_rows.of_group(store, group_id, include_deleted=False):
            if member.status in GPU_HOLDING and member.variant is not None:
                out.setdefault(group_id, member.variant)
    return out


def pending_of(
    task: Task,
    gangs: dict[str, Gang] | None = None,
    group_variants: dict[str, int] | None = None,
) -> PendingTask:
    """A pending task with the constraints its last requeue set (retry backoff, node choice);
    members of a static-world group are placed all-or-nothing (a gang), host-networked, and
    rank 0 holds the group's master port on its host (docs/groups.md); a member of a group
    with variants is held to the variant its placed members run (`load_group_variants`)."""
    gang = (gangs or {}).get(task.group_id or "")
    master: int | None = None
    if gang is not None and task.rank == 0:
        master = gang.master_port or 0
    pin = (group_variants or {}).get(task.group_id or "")
    pending = PendingTask.from_task(
        task,
        gang_id=task.group_id if gang else None,
        gang_size=gang.size if gang else 0,
        master_port=master,
        host_network=gang is not None,
        excluded_node_ids=frozenset(task.avoid_node_ids),
        required_min_vram_mb=task.min_vram_mb,
        same_node_id=task.same_node_id,
        not_before=task.not_before,
    )
    return pending if pin is None else replace(pending, variant_pin=pin)


class ClusterView:
    """Nodes and GPU-holding tasks as of the last listing, re-parsed by version.

    A listing reads (id, version) of every node and holding task, and fetches documents only
    for new or moved rows; a document is kept under its own version, so a row that moved again
    between the two queries is simply fetched once more next time. While no node changes,
    `nodes` stays the same tuple object, which lets the planner reuse its index.

    A listing costs what exists (every holding task, every node), so `refresh` lists only when
    the view was invalidated or the last listing is `relist_s` old. Between listings the view
    can only overstate what is held: the leader's own commits are the only way into a
    GPU-holding status (pending -> scheduled, and loans), and it `learn`s them as it commits;
    what frees capacity (a task leaving the holding set, a node changing) reaches the
    scheduler as an event that calls `invalidate`, and a lost event costs at most `relist_s`
    of a card looking busy, never a card given twice.
    """

    def __init__(self, max_starting: int = 0, relist_s: float = RELIST_S) -> None:
        self.max_starting = max_starting  # every node's bound on in-flight starts; 0 = none
        self.relist_s = relist_s
        self._listed_at = -math.inf  # time.monotonic() of the last listing
        self._stale = True
        self._nodes: dict[str, tuple[int, Node]] = {}
        # Holding task id -> (version, its allocation, the task itself for a fraction only:
        # a fraction's share is derived from its card, so it is derived again when nodes
        # change; whole cards are not, and their documents need not be kept).
        self._held: dict[str, tuple[int, Allocation | None, Task | None]] = {}
        self.nodes: tuple[Node, ...] = ()
        self.allocations: tuple[Allocation, ...] = ()
        # The delta of the next snapshot (AllocationDelta): tasks whose entry changed since
        # `allocations` was last built (`_dirty`), and those that changed in the builds since
        # the last snapshot (`_unsnapped`), whose allocations were `_snapped`.
        self._dirty: set[str] = set()
        self._unsnapped: set[str] = set()
        self._snapped: tuple[Allocation, ...] | None = None
        self._gpus: dict[str, Gpu] = {}
        # Nodes tagged with their pools, for the nodes tuple and pools they were tagged from
        # (kept while neither changes, so the planner's index is reused).
        self._tagged: tuple[tuple[Node, ...], Selectors, tuple[Node, ...]] = ((), {}, ())

    def invalidate(self) -> None:
        """Something this view cannot know of moved (capacity freed, a node changed, a new
        term): the next `refresh` lists again."""
        self._stale = True

    async def refresh(self, store: EventStore) -> None:
        now = time.monotonic()
        if not self._stale and now - self._listed_at < self.relist_s:
            self._allocations_from_held()  # what `learn` added since
            return
        self._stale = False
        self._listed_at = now
        node_versions, task_versions = await asyncio.gather(
            node_rows.versions(store), task_rows.holding_versions(store)
        )
        nodes_moved = await self._refresh_nodes(store, node_versions)
        await self._refresh_tasks(store, task_versions, nodes_moved)

    async def _refresh_nodes(self, store: EventStore, listed: dict[str, int]) -> bool:
        stale = [i for i, v in listed.items() if self._nodes.get(i, (None,))[0] != v]
        gone = [i for i in self._nodes if i not in listed]
        if not stale and not gone:
            return False
        for i in gone:
            del self._nodes[i]
        if stale:
            for doc in await node_rows.each_by_ids(store, stale):
                self._nodes[doc.id] = (doc.version, to_node(doc, self.max_starting))
        self.nodes = tuple(n for _, (_, n) in sorted(self._nodes.items()))
        self._gpus = {g.id: g for n in self.nodes for g in n.gpus}
        return True

    async def _refresh_tasks(
        self, store: EventStore, listed: dict[str, int], nodes_moved: bool
    ) -> None:
        for i in [i for i in self._held if i not in listed]:
            del self._held[i]
            self._dirty.add(i)
        stale = [i for i, v in listed.items() if self._held.get(i, (None,))[0] != v]
        if stale:
            self.learn(await task_rows.each_by_ids(store, stale))
        if nodes_moved:
            for i, (_, _, task) in list(self._held.items()):
                if task is not None:
                    self._held[i] = self._record(task)
                    self._dirty.add(i)
        self._allocations_from_held()

    def _allocations_from_held(self) -> None:
        self.allocations = tuple(a for _, a, _ in self._held.values() if a is not None)
        self._unsnapped |= self._dirty
        self._dirty.clear()

    def learn(self, tasks: Iterable[Task]) -> None:
        """Tasks as a commit of ours left them (the store returned them): no need to read
        them back."""
        for task in tasks:
            self._dirty.add(task.id)
            if task.status in GPU_HOLDING:
                self._held[task.id] = self._record(task)
            else:
                self._held.pop(task.id, None)

    def _delta(self) -> AllocationDelta | None:
        """What changed between the last snapshot's allocations and `allocations`; None when
        there was no snapshot, or when entries changed since `allocations` was built (the
        tuple is then behind the entries, and a delta read from them would not match it)."""
        since = self._snapped
        if self._dirty:
            self._snapped = None
            return None
        self._snapped = self.allocations
        unsnapped, self._unsnapped = self._unsnapped, set()
        if since is None:
            return None
        changed: list[Allocation] = []
        gone: list[str] = []
        for task_id in unsnapped:
            entry = self._held.get(task_id)
            if entry is None or entry[1] is None:
                gone.append(task_id)
            else:
                changed.append(entry[1])
        return AllocationDelta(since, self.allocations, tuple(changed), tuple(gone))

    def _record(self, task: Task) -> tuple[int, Allocation | None, Task | None]:
        alloc = Allocation.from_task(task, self._gpus) if task.node_id else None
        return task.version, alloc, task if placed_spec(task).is_fractional else None

    def snapshot(
        self,
        now: datetime,
        quotas: dict[str, float],
        queues: dict[str, QueueLimits] | None = None,
        pools: Selectors | None = None,
    ) -> ClusterSnapshot:
        pools = pools or {}
        base, tagged_for, tagged = self._tagged
        if base is not self.nodes or tagged_for != pools:
            tagged = tag_pools(self.nodes, pools)
            self._tagged = (self.nodes, pools, tagged)
        return ClusterSnapshot(
            now=now,
            nodes=tagged,
            allocations=self.allocations,
            tenant_quotas=quotas,
            queues=queues or {},
            delta=self._delta(),
        )
