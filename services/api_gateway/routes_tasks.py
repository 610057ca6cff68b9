"""`/api/v1/tasks`: create, list, get, update, delete, stats and operations (SPEC §2).

Handlers validate, call a pure decide function through the store, and shape the answer.
"""

from __future__ import annotations

from typing import Annotated, Any

import structlog
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from libs import auth
from libs.auth import Principal as PrincipalT
from libs.auth import Role
from libs.domain.errors import Code, DomainError
from libs.domain.group.serving_control import decide_stop_on_lost_host
from libs.domain.reasons import ReasonCode
from libs.domain.task import decide as commands
from libs.domain.task.model import (
    REPORT_FIELDS,
    SERVER_OWNED,
    Task,
    TaskSpec,
    boost_line,
    parse_create,
    parse_update,
    tenant_allow_list,
)
from libs.domain.task.states import Actor, TaskStatus
from libs.domain.validation import REPORT_TEXT_MAX
from libs.store import tasks as task_rows
from libs.store.eventstore import EventStore
from libs.store.types import TaskQuery

from . import planning, request_docs
from .as_of import AsOf, task_at
from .deps import Principal, Store, tenant_scope
from .queueing import create_in_queue, into_queue
from .responses import FastJSONResponse
from .schemas import CreateQuery, TaskListQuery, documented_body, query_of
from .views import operation_view, task_responses, task_view

router = APIRouter(prefix="/api/v1/tasks", tags=["tasks"])
log = structlog.get_logger(__name__)

CreateBody = Annotated[dict[str, Any], Depends(documented_body(request_docs.task_create))]
UpdateBody = Annotated[dict[str, Any], Depends(documented_body(request_docs.task_update))]
ListQuery = Annotated[TaskListQuery, Depends(query_of(TaskListQuery))]
FOR_TENANT = [Depends(query_of(CreateQuery))]
# What an agent or operator may send on the report path of PUT.
REPORT_BODY = (REPORT_FIELDS - {"finished_at"}) | {"expected_status", "reason"}


def actor_of(principal: PrincipalT) -> Actor:
    return {"operator": Actor.OPERATOR, "agent": Actor.AGENT}.get(
        principal.role.value, Actor.TENANT
    )


def tenant_for_create(principal: PrincipalT, request: Request) -> str:
    if principal.is_tenant:
        assert principal.tenant_id is not None
        return principal.tenant_id
    if principal.role.value == "operator":
        tenant = request.query_params.get("tenant_id")
        if not tenant:
            raise DomainError(
                Code.INVALID_VALUE,
                "operators create tasks for a tenant: add ?tenant_id=<tenant>",
                ["tenant_id"],
            )
        return tenant
    raise DomainError(Code.FORBIDDEN, "agents cannot create tasks")


async def parsed_submission(
    request: Request, principal: PrincipalT, store: EventStore, body: dict[str, Any]
) -> tuple[str, TaskSpec]:
    """A create body parsed into (tenant, spec), its queue not resolved yet."""
    settings = request.app.state.settings
    tenant_id = tenant_for_create(principal, request)
    await auth.admit_tenant(store, tenant_id, request.app.state.auth_cache)
    spec = parse_create(
        body,
        tenant=principal.is_tenant,
        volume_allow_list=tenant_allow_list(settings.volume_allow_list, tenant_id),
        defaults=settings.task_defaults(),
    )
    return tenant_id, spec


async def task_submission(
    request: Request, principal: PrincipalT, store: EventStore, body: dict[str, Any]
) -> tuple[str, TaskSpec]:
    """A create body parsed into (tenant, spec in its queue): the create's and the plan's
    one parse, so both refuse a bad body alike."""
    tenant_id, spec = await parsed_submission(request, principal, store, body)
    return tenant_id, await into_queue(store, tenant_id, spec)


@router.post("", status_code=201, dependencies=FOR_TENANT)
async def create_task(
    request: Request, principal: Principal, store: Store, body: CreateBody
) -> JSONResponse:
    tenant_id, spec = await parsed_submission(request, principal, store, body)
    task = await create_in_queue(
        store, request.app.state.held_queues, tenant_id, spec, {"principal": principal.subject}
    )
    if line := boost_line(body, spec):
        log.info(line, task_id=task.id)
    return FastJSONResponse(task_view(task), status_code=201)


@router.get("")
async def list_tasks(query: ListQuery, principal: Principal, store: Store) -> dict[str, Any]:
    q = TaskQuery(
        tenant_id=tenant_scope(principal), node_id=query.node_id or None, **query.filters()
    )
    tasks, total = await task_rows.list_tasks(store, q)
    return {
        "tasks": [task_view(t) for t in tasks],
        "total": total,
        "page": q.page,
        "per_page": q.per_page,
    }


@router.get("/stats")
async def task_stats(principal: Principal, store: Store) -> dict[str, Any]:
    counts = await task_rows.task_stats(store, tenant_scope(principal))
    return {"total": sum(counts.values()), "by_status": counts}


@router.get("/{task_id}", responses=task_responses())
async def get_task(task_id: str, principal: Principal, store: Store, q: AsOf) -> dict[str, Any]:
    if (at := q.at()) is not None:
        return task_view(await task_at(store, task_id, tenant_scope(principal), at))
    task = await store.get_task(task_id, tenant_id=tenant_scope(principal))
    return await planning.with_pending(store, task_view(task), task)


@router.put("/{task_id}")
async def update_task(
    request: Request, task_id: str, principal: Principal, store: Store, body: UpdateBody
) -> dict[str, Any]:
    reported = sorted((REPORT_FIELDS | {"expected_status"}) & body.keys())
    if principal.is_tenant and reported:
        raise DomainError(
            Code.FORBIDDEN,
            f"execution-report fields are reserved to agents and operators: {', '.join(reported)}",
            reported,
        )
    scope = tenant_scope(principal)
    if principal.can_report and "status" in body:
        task = await _report(store, task_id, principal, body)
        return task_view(task)
    allow = request.app.state.settings.volume_allow_list

    def decide(t: Task) -> list[Any]:
        mine = tenant_allow_list(allow, t.tenant_id)
        _, changes = parse_update(t, body, tenant=principal.is_tenant, volume_allow_list=mine)
        return list(commands.decide_config_update(t, changes))

    task = await store.execute(
        task_id, decide, tenant_id=scope, metadata={"principal": principal.subject}
    )
    return task_view(task)


async def _report(store: Store, task_id: str, principal: PrincipalT, body: dict[str, Any]) -> Task:
    """Agent/operator report: whitelist + CAS on `expected_status` (or the table alone)."""
    extra = sorted(set(body) - REPORT_BODY)
    if extra:
        owned = [k for k in extra if k in SERVER_OWNED]
        code = Code.SERVER_OWNED_FIELD if owned else Code.UNKNOWN_FIELD
        raise DomainError(code, f"not accepted in a status report: {', '.join(extra)}", extra)
    try:
        to = TaskStatus(str(body["status"]).lower())
        expected = (
            TaskStatus(str(body["expected_status"]).lower())
            if body.get("expected_status")
            else None
        )
    except ValueError:
        raise DomainError(
            Code.INVALID_VALUE, "unknown status value", ["status", "expected_status"]
        ) from None
    fields: dict[str, Any] = {}
    for name, kind in (
        ("exit_code", int),
        ("result", str),
        ("error", str),
        ("node_id", str),
        ("container_id", str),
    ):
        if body.get(name) is not None:
            if not isinstance(body[name], kind) or isinstance(body[name], bool):
                raise DomainError(Code.INVALID_VALUE, f"{name} must be {kind.__name__}", [name])
            if kind is str and len(body[name]) > REPORT_TEXT_MAX:
                raise DomainError(
                    Code.INVALID_VALUE,
                    f"{name} is longer than {REPORT_TEXT_MAX} characters",
                    [name],
                )
            fields[name] = body[name]
    actor = actor_of(principal)
    if (
        principal.role is Role.AGENT
        and fields.get("node_id", principal.node_id) != principal.node_id
    ):
        raise DomainError(Code.FORBIDDEN, "an agent reports for its own node only", ["node_id"])

    def decide(t: Task) -> list[Any]:
        if principal.role is Role.AGENT and (
            principal.node_id is None or t.node_id != principal.node_id
        ):
            # 403, not 404: the key is valid but acts for another node (SPEC §2's 404 hides
            # one tenant's task from another tenant; an agent is no tenant).
            raise DomainError(
                Code.FORBIDDEN, f"task {t.id} is not placed on this agent's node", ["node_id"]
            )
        return list(
            commands.decide_transition(
                t,
                to,
                actor=actor,
                expected_status=expected,
                report=True,
                reason_code=ReasonCode.REPORTED,
                reason=str(body.get("reason") or "reported"),
                **fields,
            )
        )

    return await store.execute(
        task_id, decide, metadata={"principal": principal.subject}, include_deleted=True
    )


@router.delete("/{task_id}")
async def delete_task(task_id: str, principal: Principal, store: Store) -> dict[str, Any]:
    actor = actor_of(principal)
    task = await task_rows.execute_by_host(
        store,
        task_id,
        lambda t, _online: commands.decide_delete(t, actor),
        decide_stop_on_lost_host,
        tenant_id=tenant_scope(principal),
        metadata={"principal": principal.subject},
    )
    return operation_view(task, "task deleted")


@router.post("/{task_id}/stop")
async def stop_task(task_id: str, principal: Principal, store: Store) -> dict[str, Any]:
    actor = actor_of(principal)
    # A task told to stop on a node that is offline ends `stopped` in the same transaction:
    # no agent is there to report it (SPEC §3: `stopping` ends in place on node loss).
    task = await task_rows.execute_by_host(
        store,
        task_id,
        lambda t, _online: commands.decide_stop(t, actor),
        decide_stop_on_lost_host,
        tenant_id=tenant_scope(principal),
        metadata={"principal": principal.subject},
    )
    return operation_view(task, stop_message(task))


def stop_message(task: Task) -> str:
    if task.status is TaskStatus.STOPPING:
        return "stop requested: the task is stopping"
    return f"task {task.status.value}"


@router.post("/{task_id}/sleep")
async def sleep_task(task_id: str, principal: Principal, store: Store) -> dict[str, Any]:
    actor = actor_of(principal)
    task = await store.execute(
        task_id,
        lambda t: commands.decide_sleep(t, actor),
        tenant_id=tenant_scope(principal),
        metadata={"principal": principal.subject},
    )
    return operation_view(task, "task put to sleep")
