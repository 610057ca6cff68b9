"""The scheduler's view of the cluster, read from the projections.

Nodes and GPU-holding tasks become a `ClusterSnapshot`; pending tasks become `PendingTask`s.
Reading the projections each round keeps the view exactly what the store says (the scheduler
holds no state a crash could lose); the queries use the partial index on pending tasks.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from libs.domain.group import Group
from libs.domain.node import Node as NodeDoc
from libs.domain.node import NodeStatus
from libs.domain.states import GPU_HOLDING
from libs.domain.task import Task
from libs.store.eventstore import EventStore

from .model import Allocation, ClusterSnapshot, Gpu, Node, PendingTask

HOLDING = [s.value for s in GPU_HOLDING]


def to_node(doc: NodeDoc) -> Node:
    inv = doc.inventory
    excluded = set(doc.excluded_gpus)
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
                excluded=g.id in excluded,
            )
            for g in inv.gpus
        ),
        labels=dict(inv.labels),
    )


async def load_nodes(store: EventStore) -> list[NodeDoc]:
    rows = await store.fetch("SELECT doc FROM nodes ORDER BY id")
    return [NodeDoc.model_validate(r["doc"]) for r in rows]


async def load_holding(store: EventStore) -> list[Task]:
    rows = await store.fetch("SELECT doc FROM tasks WHERE status = ANY(%s)", [HOLDING])
    return [Task.model_validate(r["doc"]) for r in rows]


async def load_pending(store: EventStore, limit: int) -> list[Task]:
    rows = await store.fetch(
        "SELECT doc FROM tasks WHERE status = 'pending' AND deleted_at IS NULL"
        " ORDER BY priority DESC, created_at LIMIT %s",
        [limit],
    )
    return [Task.model_validate(r["doc"]) for r in rows]


async def load_quotas(store: EventStore) -> dict[str, float]:
    rows = await store.fetch("SELECT id, gpu_quota FROM tenants WHERE gpu_quota > 0")
    return {r["id"]: float(r["gpu_quota"]) for r in rows}


def snapshot(
    now: datetime, nodes: Sequence[NodeDoc], holding: Sequence[Task], quotas: dict[str, float]
) -> ClusterSnapshot:
    sched_nodes = tuple(to_node(n) for n in nodes)
    gpus = {g.id: g for n in sched_nodes for g in n.gpus}
    return ClusterSnapshot(
        now=now,
        nodes=sched_nodes,
        allocations=tuple(Allocation.from_task(t, gpus) for t in holding if t.node_id),
        tenant_quotas=quotas,
    )


async def load_gangs(store: EventStore, tasks: Sequence[Task]) -> dict[str, int]:
    """Static-world groups among the pending tasks' groups: group id → world size."""
    ids = sorted({t.group_id for t in tasks if t.group_id})
    if not ids:
        return {}
    rows = await store.fetch("SELECT doc FROM groups WHERE id = ANY(%s)", [ids])
    groups = [Group.model_validate(r["doc"]) for r in rows]
    return {g.id: g.spec.shape.task_count for g in groups if g.spec.static_world}


def pending_of(task: Task, gangs: dict[str, int] | None = None) -> PendingTask:
    """A pending task with the constraints its last requeue set (retry backoff, node choice);
    members of a static-world group are placed all-or-nothing (a gang)."""
    gang = (gangs or {}).get(task.group_id or "")
    return PendingTask.from_task(
        task,
        gang_id=task.group_id if gang else None,
        gang_size=gang or 0,
        excluded_node_ids=frozenset(task.avoid_node_ids),
        required_min_vram_mb=task.min_vram_mb,
        same_node_id=task.same_node_id,
        not_before=task.not_before,
    )
