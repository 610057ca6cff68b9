"""The scheduler's view read for a plan or a "why pending" answer, and those answers as JSON.

Both run the scheduler's own code read-only (docs/scheduling.md, "Plan and ETA"): the
snapshot is built by `services.scheduler.view` from the projections, exactly as a placement
round builds it, and handed to the pure core (`placement.dryrun`, `placement.eta`), so a plan
and a placement cannot disagree by construction. Nothing here writes.

Typical runtimes are learned from the tenants' finished tasks: the task projection is the
fold of their `started` and `completed` events, so their `started_at`/`finished_at` are the
log's times.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from libs.domain.task.model import Task
from libs.domain.task.states import TaskStatus
from libs.store import tasks as task_rows
from libs.store.eventstore import EventStore
from libs.store.types import TaskQuery
from services.scheduler import view
from services.scheduler.placement.dryrun import NodeAnswer, TaskRun
from services.scheduler.placement.eta import Holding, PendingInfo, Runtime, estimate, runtime_of
from services.scheduler.placement.model import ClusterSnapshot, PendingTask

# The pending tasks read to place one in line (the scheduler reads this many per round too).
PENDING_LIMIT = 2_000
# Finished tasks per tenant a typical runtime is learned from (the newest).
RUNTIME_SAMPLES = 200
# Nodes listed per task in a plan; the rest are counted.
PLAN_NODES = 20


@dataclass(frozen=True, slots=True)
class Cluster:
    snapshot: ClusterSnapshot
    holding: dict[str, Holding]
    pending: list[Task]


async def read_cluster(store: EventStore) -> Cluster:
    nodes, holding, quotas, (queues, pools), pending = await asyncio.gather(
        view.load_nodes(store),
        view.load_holding(store),
        view.load_quotas(store),
        view.load_admission(store),
        view.load_pending(store, PENDING_LIMIT),
    )
    snapshot = view.snapshot(store.clock(), nodes, holding, quotas, queues, pools)
    runtimes = await learned_runtimes(store, {t.tenant_id for t in (*holding, *pending)})
    # Placed tasks end from their start; pending ones (ahead in line) from when they start.
    holders: dict[str, Holding] = {
        t.id: Holding(t.started_at, t.spec.timeout, runtimes.get((t.tenant_id, t.spec.image)))
        for t in (*holding, *pending)
    }
    return Cluster(snapshot, holders, pending)


async def learned_runtimes(
    store: EventStore, tenants: Iterable[str]
) -> dict[tuple[str, str], Runtime]:
    """(tenant, image) -> the typical runtime of its newest completed tasks."""
    out: dict[tuple[str, str], Runtime] = {}
    for tenant in sorted(tenants):
        q = TaskQuery(tenant_id=tenant, status=TaskStatus.COMPLETED.value, per_page=RUNTIME_SAMPLES)
        done, _ = await task_rows.list_tasks(store, q)
        by_image: dict[str, list[float]] = {}
        for t in done:
            if t.started_at and t.finished_at:
                seconds = (t.finished_at - t.started_at).total_seconds()
                by_image.setdefault(t.spec.image, []).append(seconds)
        for image, durations in by_image.items():
            if (r := runtime_of(durations)) is not None:
                out[(tenant, image)] = r
    return out


async def pending_tasks(store: EventStore, cluster: Cluster) -> list[PendingTask]:
    gangs = await view.load_gangs(store, cluster.pending)
    return [view.pending_of(t, gangs) for t in cluster.pending]


def pending_info(
    cluster: Cluster, line: Sequence[PendingTask], task: PendingTask, reason: Any, detail: str
) -> PendingInfo:
    """`task`'s answer with `line` the pending work (it is added when missing)."""
    if all(t.task_id != task.task_id for t in line):
        line = [*line, task]
    return estimate(cluster.snapshot, task, line, cluster.holding, reason=reason, detail=detail)


async def pending_view(store: EventStore, task: Task) -> dict[str, Any] | None:
    """The "why pending" object of a pending task (None for any other status)."""
    if task.status is not TaskStatus.PENDING:
        return None
    cluster = await read_cluster(store)
    line = await pending_tasks(store, cluster)
    me = next((t for t in line if t.task_id == task.id), None)
    if me is None:  # beyond the pending read: its own constraints, last in line
        me = view.pending_of(task, await view.load_gangs(store, [task]))
    info = pending_info(cluster, line, me, task.pending_reason_code, task.pending_reason)
    return info_json(info)


async def first_pending_view(store: EventStore, tasks: Sequence[Task]) -> dict[str, Any] | None:
    """A group's or job's answer: that of its first pending task (rank, then creation)."""
    waiting = sorted(
        (t for t in tasks if t.status is TaskStatus.PENDING),
        key=lambda t: (t.rank if t.rank is not None else 0, t.created_at, t.id),
    )
    if not waiting:
        return None
    body = await pending_view(store, waiting[0])
    if body is not None:
        body = {"task_id": waiting[0].id, "tasks_pending": len(waiting), **body}
    return body


def when(at: datetime) -> str:
    return at.isoformat()


def info_json(info: PendingInfo) -> dict[str, Any]:
    eta: dict[str, str] | str = "unknown"
    if info.eta is not None:
        eta = {"at": when(info.eta.at), "low": when(info.eta.low), "high": when(info.eta.high)}
    return {
        "stage": info.stage or "unevaluated",
        "reason": info.reason.value if info.reason else None,
        "detail": info.detail,
        "queue": info.queue,
        "position": info.position,
        "eta": eta,
        "method": info.method,
    }


def node_json(a: NodeAnswer) -> dict[str, Any]:
    if a.fits:
        return {"node_id": a.node_id, "fits": True, "gpu_ids": list(a.gpu_ids), "scores": a.scores}
    return {
        "node_id": a.node_id,
        "fits": False,
        "stage": a.stage,
        "reason": a.reason.value if a.reason else None,
        "message": a.message,
    }


def run_json(run: TaskRun) -> dict[str, Any]:
    adm = run.admission
    return {
        "admission": {
            "queue": adm.queue,
            "queue_limits": dict(adm.queue_limits),
            "queue_used": dict(adm.queue_used),
            "tenant_quota": adm.tenant_quota,
            "tenant_used": adm.tenant_used,
            "admitted": adm.verdict.ok,
            "reason": adm.verdict.reason.value if adm.verdict.reason else None,
            "message": adm.verdict.message,
        },
        "nodes": [node_json(a) for a in run.nodes[:PLAN_NODES]],
        "nodes_more": max(0, len(run.nodes) - PLAN_NODES),
        "nodes_fit": sum(1 for a in run.nodes if a.fits),
    }


async def with_pending(store: EventStore, body: dict[str, Any], task: Task) -> dict[str, Any]:
    """A task's view with its "why pending" object (`pending`, null unless pending)."""
    body["pending"] = await pending_view(store, task)
    return body


async def with_first_pending(
    store: EventStore, body: dict[str, Any], tasks: Sequence[Task]
) -> dict[str, Any]:
    """A group's or job's view with the "why pending" object of its first pending task."""
    body["pending"] = await first_pending_view(store, tasks)
    return body
