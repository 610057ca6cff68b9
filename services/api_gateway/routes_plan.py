"""`POST /api/v1/tasks/plan`, `/task-groups/plan`, `/jobs/plan`: a submission planned, not made.

The body is the create's, parsed by the create's own function (`task_submission`,
`group_submission`, `job_submission`), so a bad body gets the create's refusal byte for byte.
Nothing is written: the tasks the create would make are built in memory and handed with a
snapshot of the projections to the placement core's dry run (planning.py). The routes are
registered before the create routers so no `/{id}` path can take `plan`.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from libs.domain.job.decide import cascade
from libs.domain.job.events import JobSubmitted
from libs.domain.job.evolve import evolve_job
from libs.domain.task.model import Task, TaskId, TaskSpec, TenantId
from libs.store.eventstore import EventStore
from services.scheduler import view
from services.scheduler.placement.dryrun import dry_run, stage_of
from services.scheduler.placement.model import Plan

from . import planning, request_docs
from .deps import Principal, Store
from .routes_groups import group_submission
from .routes_jobs import job_submission
from .routes_tasks import FOR_TENANT, task_submission
from .schemas import documented_body

router = APIRouter(prefix="/api/v1", tags=["plan"])

TaskBody = Annotated[dict[str, Any], Depends(documented_body(request_docs.task_create))]
GroupBody = Annotated[dict[str, Any], Depends(documented_body(request_docs.group_create))]
JobBody = Annotated[dict[str, Any], Depends(documented_body(request_docs.job_create))]

Planned = tuple[str, Task]  # (what the submission calls it, the task it would create)


@router.post("/tasks/plan", dependencies=FOR_TENANT)
async def plan_task(
    request: Request, principal: Principal, store: Store, body: TaskBody
) -> dict[str, Any]:
    """What `POST /tasks` would do with this body now, writing nothing."""
    tenant_id, spec = await task_submission(request, principal, store, body)
    now = store.clock()
    return await _answer(store, "task", [("task", _task(tenant_id, spec, now))])


@router.post("/task-groups/plan", dependencies=FOR_TENANT)
async def plan_group(
    request: Request, principal: Principal, store: Store, body: GroupBody
) -> dict[str, Any]:
    """What `POST /task-groups` would do with this body now, writing nothing."""
    tenant_id, spec = await group_submission(request, principal, store, body)
    now, group_id = store.clock(), "grp-plan-" + uuid.uuid4().hex[:8]
    members = [
        (f"rank {r}", _task(tenant_id, spec.member_spec(r), now, group_id, r))
        for r in range(spec.shape.task_count)
    ]
    static = {group_id: view.Gang(spec.shape.task_count, spec.shape.master_port)}
    return await _answer(store, "group", members, static if spec.static_world else {})


@router.post("/jobs/plan", dependencies=FOR_TENANT)
async def plan_job(
    request: Request, principal: Principal, store: Store, body: JobBody
) -> dict[str, Any]:
    """What `POST /jobs` would do with this body now: the tasks ready at once, planned."""
    tenant_id, spec = await job_submission(request, principal, store, body)
    now, job_id = store.clock(), "job-plan-" + uuid.uuid4().hex[:8]
    submitted = JobSubmitted(job_id=job_id, tenant_id=TenantId(tenant_id), spec=spec)
    _, ready = cascade(evolve_job(None, submitted, now, 1), _plan_id)
    tasks = [(s.name or i, _task(tenant_id, s, now, task_id=i)) for i, s in ready]
    return await _answer(store, "job", tasks)


def _plan_id() -> TaskId:
    return TaskId("plan-" + uuid.uuid4().hex[:12])


def _task(
    tenant_id: str,
    spec: TaskSpec,
    now: Any,
    group_id: str | None = None,
    rank: int | None = None,
    task_id: str = "",
) -> Task:
    return Task(
        id=TaskId(task_id or _plan_id()),
        tenant_id=TenantId(tenant_id),
        spec=spec,
        group_id=group_id,
        rank=rank,
        created_at=now,
        updated_at=now,
    )


async def _answer(
    store: EventStore,
    kind: str,
    planned: Sequence[Planned],
    gangs: dict[str, view.Gang] | None = None,
) -> dict[str, Any]:
    cluster = await planning.read_cluster(store)
    submitted = [view.pending_of(t, gangs or {}) for _, t in planned]
    run = dry_run(cluster.snapshot, submitted)
    tasks = []
    for (name, task), pending, task_run in zip(planned, submitted, run.tasks, strict=True):
        body = {"name": name, **_outcome(run.plan, pending.task_id), **planning.run_json(task_run)}
        if body["outcome"] != "placed":
            why = run.plan.unplaced_for(pending.task_id)
            info = await planning.answer(
                store,
                cluster,
                task,
                task_run.task,
                why.reason if why else None,
                why.message if why else "",
            )
            body["pending"] = planning.info_json(info)
        tasks.append(body)
    return {
        "kind": kind,
        "valid": True,
        "written": False,
        "evaluated_at": planning.when(cluster.snapshot.now),
        "fits": all(t["outcome"] == "placed" for t in tasks),
        "tasks": tasks,
    }


def _outcome(plan: Plan, task_id: str) -> dict[str, Any]:
    placed = plan.placement_for(task_id)
    if placed is not None:
        return {
            "outcome": "placed",
            "node_id": placed.node_id,
            "gpu_ids": list(placed.gpu_ids),
            "qos": placed.qos.value if placed.qos else None,
            "ports": dict(placed.ports),
            "scores": dict(placed.scores),
            # The variant it would run (docs/scheduling.md#variants), where the planner
            # chooses one.
            "variant": getattr(placed, "variant", None),
            "preempts": [],
        }
    why = plan.unplaced_for(task_id)
    preempts = [
        {"node_id": p.node_id, "victims": list(p.victims)}
        for p in plan.preemptions
        if p.task_id == task_id
    ]
    return {
        "outcome": "preempting" if preempts else "pending",
        "stage": stage_of(why.reason) if why else "",
        "reason": why.reason.value if why else None,
        "message": why.message if why else "",
        "preempts": preempts,
    }
