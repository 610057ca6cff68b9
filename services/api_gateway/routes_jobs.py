"""`/api/v1/jobs`: submit a DAG of tasks, see it, stop it, delete it, read its events.

Submission validates the whole DAG (every problem named in one answer), appends
`job_submitted` and creates the tasks that are ready at once, in one transaction. Later
tasks are created by the job orchestrator when their dependencies' terminal events arrive.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from libs import auth
from libs.auth import Principal as PrincipalT
from libs.domain.errors import DomainError, NotFound
from libs.domain.job.decide import advance, cascade
from libs.domain.job.events import JobDeleted, JobStopRequested, JobSubmitted
from libs.domain.job.evolve import evolve_job
from libs.domain.job.model import DONE, Job
from libs.domain.job.spec import JobSpec, parse_job
from libs.domain.payload import Payload
from libs.domain.task import decide as commands
from libs.domain.task.model import Task, TenantId, tenant_allow_list
from libs.domain.task.states import TERMINAL
from libs.store import jobs as job_rows
from libs.store import tasks as task_rows
from libs.store.eventstore import EventStore, NewTask, new_task_id
from libs.store.projections import JOBS

from . import planning, request_docs
from .as_of import AsOf, job_at
from .deps import Principal, Store, page_query, tenant_scope
from .queueing import queue_for
from .responses import FastJSONResponse
from .routes_tasks import FOR_TENANT, actor_of, tenant_for_create
from .schemas import PageQuery, documented_body, query_of

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])
CreateBody = Annotated[dict[str, Any], Depends(documented_body(request_docs.job_create))]


def _task_brief(task: Task) -> dict[str, Any]:
    return {
        "id": task.id,
        "status": task.status.value,
        "node_id": task.node_id,
        "pending_reason": task.pending_reason,
        "exit_code": task.exit_code,
        "retry_count": task.retry_count,
        "created_at": task.created_at.isoformat(),
        "started_at": task.started_at.isoformat() if task.started_at else None,
        "finished_at": task.finished_at.isoformat() if task.finished_at else None,
    }


def job_view(job: Job, tasks: list[Task] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": job.id,
        "tenant_id": job.tenant_id,
        "name": job.spec.name,
        "queue": job.spec.queue,
        "status": job.status.value,
        "reason_code": job.reason_code.value,
        "reason": job.reason,
        "created_at": job.created_at.isoformat(),
        "updated_at": job.updated_at.isoformat(),
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
    }
    if tasks is None:
        return body
    newest: dict[str, Task] = {}
    for t in tasks:  # created_at order: the last of a key is its task
        newest[t.spec.platform.job_key] = t
    nodes = []
    for spec in job.spec.tasks:
        node, task = job.nodes[spec.key], newest.get(spec.key)
        waiting = task is not None and task.status.value == "pending" and task.pending_reason
        nodes.append(
            {
                "key": spec.key,
                "status": node.state.value if task is None else task.status.value,
                "state": node.state.value,
                "why": (task.pending_reason if waiting else node.reason) if task else node.reason,
                "depends_on": [
                    d.model_dump(mode="json", exclude_defaults=True)
                    for d in job.spec.upstream(spec.key)
                ],
                "metrics": node.metrics,
                "artifacts": list(node.artifacts),
                "task": _task_brief(task) if task else None,
            }
        )
    body["tasks"] = nodes
    return body


async def _load(store: EventStore, job_id: str, tenant: str | None) -> Job:
    job = await job_rows.get(store, job_id)
    if job is None or (tenant is not None and job.tenant_id != tenant):
        raise NotFound("job")
    return job


async def job_submission(
    request: Request, principal: PrincipalT, store: EventStore, body: dict[str, Any]
) -> tuple[str, JobSpec]:
    """A submission body parsed into (tenant, spec): the submit's and the plan's one parse,
    so both refuse a bad body alike."""
    tenant_id = tenant_for_create(principal, request)
    await auth.admit_tenant(store, tenant_id, request.app.state.auth_cache)
    raw_queue = body.get("queue", "")
    queue, queue_problem = None, ""
    if not isinstance(raw_queue, str):
        queue_problem = "must be a string"
    else:
        try:
            queue = await queue_for(store, tenant_id, raw_queue)
        except DomainError as exc:  # reported with every other problem of the job
            queue_problem = exc.message
    spec = parse_job(
        body,
        tenant=principal.is_tenant,
        volume_allow_list=tenant_allow_list(
            request.app.state.settings.volume_allow_list, tenant_id
        ),
        queue=queue.spec.name if queue else "",
        queue_max_gpus=queue.spec.quota.max_gpus if queue else 0,
        queue_problem=queue_problem,
        defaults=request.app.state.settings.task_defaults(),
    )
    return tenant_id, spec


@router.post("", status_code=201, dependencies=FOR_TENANT)
async def create_job(
    request: Request, principal: Principal, store: Store, body: CreateBody
) -> JSONResponse:
    tenant_id, spec = await job_submission(request, principal, store, body)
    job_id = "job-" + uuid.uuid4().hex[:16]
    submitted = JobSubmitted(job_id=job_id, tenant_id=TenantId(tenant_id), spec=spec)

    def decide(_: Job | None) -> tuple[list[Payload], list[NewTask]]:
        events, ready = cascade(evolve_job(None, submitted, store.clock(), 1), new_task_id)
        tasks: list[NewTask] = [(TenantId(tenant_id), spec, None, None, i) for i, spec in ready]
        return [submitted, *events], tasks

    job, tasks = await store.execute_with_tasks(
        JOBS, job_id, decide, metadata={"principal": principal.subject}
    )
    assert job is not None
    return FastJSONResponse(job_view(job, tasks), status_code=201)


@router.get("", dependencies=[Depends(query_of(PageQuery))])
async def list_jobs(request: Request, principal: Principal, store: Store) -> dict[str, Any]:
    page, per_page, status = page_query(request)
    found, total = await job_rows.page(store, tenant_scope(principal), status, page, per_page)
    return {
        "jobs": [job_view(j) for j in found],
        "total": total,
        "page": page,
        "per_page": per_page,
    }


@router.get("/{job_id}")
async def get_job(job_id: str, principal: Principal, store: Store, q: AsOf) -> dict[str, Any]:
    if (at := q.at()) is not None:
        return job_view(*await job_at(store, job_id, tenant_scope(principal), at))
    job = await _load(store, job_id, tenant_scope(principal))
    tasks = await task_rows.of_job(store, job_id)
    return await planning.with_first_pending(store, job_view(job, tasks), tasks)


@router.get("/{job_id}/events")
async def job_events(job_id: str, principal: Principal, store: Store) -> dict[str, Any]:
    await _load(store, job_id, tenant_scope(principal))
    events = await store.read_stream(job_id)
    return {
        "events": [
            {
                "version": e.version,
                "type": e.type,
                "occurred_at": e.occurred_at.isoformat(),
                "payload": e.payload,
            }
            for e in events
        ]
    }


async def _stop(store: EventStore, job: Job, principal: Principal, *, delete: bool) -> Job:
    """Skip what waits, stop what runs; with `delete`, the job leaves queries too."""

    def decide(current: Job | None) -> list[Payload]:
        if current is None or current.deleted_at is not None:
            raise NotFound("job")
        events: list[Payload] = []
        if not current.stop_requested and any(n.state not in DONE for n in current.nodes.values()):
            stop = JobStopRequested(job_id=current.id)
            events.append(stop)
            moved, _ = advance(evolve_job(current, stop, store.clock(), current.version + 1))
            events.extend(moved)
        if delete:
            events.append(JobDeleted(job_id=current.id))
        return events

    meta = {"principal": principal.subject}
    after = await store.execute_aggregate(JOBS, job.id, decide, metadata=meta)
    actor = actor_of(principal)
    for task in await task_rows.of_job(store, job.id):
        if task.status not in TERMINAL:
            await store.execute(task.id, lambda t: commands.decide_stop(t, actor), metadata=meta)
    assert after is not None
    return after


@router.post("/{job_id}/stop")
async def stop_job(job_id: str, principal: Principal, store: Store) -> dict[str, Any]:
    job = await _load(store, job_id, tenant_scope(principal))
    job = await _stop(store, job, principal, delete=False)
    return job_view(job, await task_rows.of_job(store, job_id))


@router.delete("/{job_id}")
async def delete_job(job_id: str, principal: Principal, store: Store) -> dict[str, Any]:
    job = await _load(store, job_id, tenant_scope(principal))
    await _stop(store, job, principal, delete=True)
    return {"id": job_id, "deleted": True}
