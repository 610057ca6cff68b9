"""The scheduler's view read for a plan or a "why pending" answer, and those answers as JSON.

Both run the scheduler's own code read-only (docs/scheduling.md, "Plan and ETA"): the
snapshot is built by `services.scheduler.view` from the projections, exactly as a placement
round builds it, and handed to the pure core (`placement.dryrun`, `placement.eta`), so a plan
and a placement cannot disagree by construction. Nothing here writes.

Typical runtimes are learned from the tenants' finished tasks: the task projection is the
fold of their events, so their `started_at`/`finished_at` are the log's times. The reads are
bounded by what the answer needs: the work that may be ahead of the task (libs/store/tasks.py
`pending_ahead`), its place in its queue by a count, the runtimes as numbers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from libs.domain.task.model import Task
from libs.domain.task.states import TaskStatus
from libs.store import tasks as task_rows
from libs.store.eventstore import EventStore
from services.scheduler import view
from services.scheduler.placement.dryrun import NodeAnswer, TaskRun
from services.scheduler.placement.eta import (
    Holding,
    PendingInfo,
    estimate,
    needs_line,
    queues_before,
    runtime_of,
)
from services.scheduler.placement.model import ClusterSnapshot, PendingTask
from services.scheduler.placement.reasons import Reason

# The most pending tasks read as the work ahead of one (each is a document to parse, about
# 0.25 ms); past it the estimate is not made.
PENDING_LIMIT = 500
# Finished tasks per tenant a typical runtime is learned from (the newest).
RUNTIME_SAMPLES = 200
# Nodes listed per task in a plan; the rest are counted.
PLAN_NODES = 20


@dataclass(frozen=True, slots=True)
class Cluster:
    snapshot: ClusterSnapshot
    holding: list[Task]


async def read_cluster(store: EventStore) -> Cluster:
    """The snapshot a placement round would build now (nodes, GPU holders, quotas, queues)."""
    nodes, holding, quotas, (queues, pools) = await asyncio.gather(
        view.load_nodes(store),
        view.load_holding(store),
        view.load_quotas(store),
        view.load_admission(store),
    )
    snapshot = view.snapshot(store.clock(), nodes, holding, quotas, queues, pools)
    return Cluster(snapshot, holding)


async def bounds(store: EventStore, tasks: Sequence[Task]) -> dict[str, Holding]:
    """Each task's timeout and its tenant's typical runtime of its image. A placed task is
    counted from its start, a pending one (ahead in line) from when it would start."""
    samples = await task_rows.finished_runtimes(
        store, {t.tenant_id for t in tasks}, RUNTIME_SAMPLES
    )
    by_image: dict[tuple[str, str], list[float]] = {}
    for tenant, image, seconds in samples:
        by_image.setdefault((tenant, image), []).append(seconds)
    runtimes = {k: r for k, v in by_image.items() if (r := runtime_of(v)) is not None}
    return {
        t.id: Holding(
            None if t.status is TaskStatus.PENDING else t.started_at,
            t.spec.timeout,
            runtimes.get((t.tenant_id, t.spec.image)),
        )
        for t in tasks
    }


async def answer(
    store: EventStore,
    cluster: Cluster,
    task: Task,
    me: PendingTask,
    reason: Reason | None,
    detail: str,
) -> PendingInfo:
    """`task`'s "why pending" answer (`me`: it as placement sees it). The work ahead is read
    only when it can matter (eta.needs_line): a reason no task's end changes needs none."""
    snapshot = cluster.snapshot
    first, fifo = queues_before(snapshot, task.spec.queue)
    if needs_line(snapshot, me, reason):
        ahead = await task_rows.pending_ahead(store, task, fifo, first, PENDING_LIMIT)
        if ahead is None:
            info = estimate(snapshot, me, [me], {}, reason=reason, detail=detail)
            why = f"more than {PENDING_LIMIT} pending tasks may be ahead: not estimated"
            info = replace(info, eta=None, method=why)
        else:
            gangs = await view.load_gangs(store, ahead)
            line = [*(view.pending_of(t, gangs) for t in ahead), me]
            holders = await bounds(store, [*cluster.holding, *ahead])
            info = estimate(snapshot, me, line, holders, reason=reason, detail=detail)
    else:
        info = estimate(snapshot, me, [me], {}, reason=reason, detail=detail)
    return replace(info, position=await task_rows.queue_position(store, task, fifo))


async def pending_view(store: EventStore, task: Task) -> dict[str, Any] | None:
    """The "why pending" object of a pending task (None for any other status)."""
    if task.status is not TaskStatus.PENDING:
        return None
    cluster = await read_cluster(store)
    me = view.pending_of(task, await view.load_gangs(store, [task]))
    info = await answer(store, cluster, task, me, task.pending_reason_code, task.pending_reason)
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
        **nodes_json(run.nodes),
        "variants": [
            {"index": v.index, "considered_from": when(v.considered_from), **nodes_json(v.nodes)}
            for v in run.variants
        ],
    }


def nodes_json(nodes: Sequence[NodeAnswer]) -> dict[str, Any]:
    return {
        "nodes": [node_json(a) for a in nodes[:PLAN_NODES]],
        "nodes_more": max(0, len(nodes) - PLAN_NODES),
        "nodes_fit": sum(1 for a in nodes if a.fits),
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
