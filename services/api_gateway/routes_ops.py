"""Operations that reach a node: wake, logs (plain and Server-Sent Events), node inventory."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from libs import auth
from libs.bus.subjects import node_logs_subject
from libs.domain.errors import Code, DomainError, NotFound
from libs.domain.group.serving_control import decide_wake
from libs.domain.protocol import LogsReply, LogsRequest
from libs.domain.reasons import ReasonCode
from libs.domain.task.history import retry_history
from libs.domain.task.model import Task
from libs.domain.task.states import TERMINAL, TaskStatus
from libs.store import nodes as node_rows
from libs.store import tasks as task_rows
from libs.store.eventstore import EventStore, payload_of

from . import timeline
from .as_of import AsOf, node_at
from .deps import Principal, Store, require_operator, tenant_scope
from .responses import FastJSONResponse
from .routes_tasks import actor_of
from .schemas import JoinTokenQuery, LogsQuery, TimelineQuery, query_of
from .views import operation_view

router = APIRouter(prefix="/api/v1", tags=["operations"])
S = TaskStatus
WAKE_WAIT_S = 10.0
LOG_REQUEST_TIMEOUT_S = 5.0


WAKE_ACCEPTED: dict[int | str, dict[str, Any]] = {
    202: {
        "description": "not resumed yet: `queued` (its card is lent to a training task of the "
        "tenant; the scheduler wakes it when that task ends) or `rescheduling` (the host is "
        "offline)"
    }
}


@router.post("/tasks/{task_id}/wake", responses=WAKE_ACCEPTED)
async def wake_task(task_id: str, principal: Principal, store: Store) -> JSONResponse:
    scope, actor = tenant_scope(principal), actor_of(principal)
    task = await store.get_task(task_id, tenant_id=scope)
    if task.status is not S.SLEEPING:
        raise DomainError(
            Code.INVALID_STATUS_FOR_OPERATION,
            f"task is not sleeping, current status: {task.status.value}",
        )
    # The host's status is read under the task's lock, in the transaction of the wake.
    task = await task_rows.execute_by_host(
        store,
        task_id,
        lambda t, online: decide_wake(t, online, actor, ReasonCode.USER_WAKE, "wake requested"),
        tenant_id=scope,
    )
    if task.status is S.PENDING:  # the host is gone: run it again elsewhere, no retry needed
        return _rescheduling(task_id)
    if task.wake_queued:
        return _queued(task)
    task = await _wait_for(store, task_id, {S.RUNNING, S.PENDING}, WAKE_WAIT_S)
    if task.status is S.RUNNING:
        return FastJSONResponse(operation_view(task, "task woke up"))
    if task.status is S.PENDING:  # the node was lost while waking: placed again
        return _rescheduling(task_id)
    # SPEC §2 knows two 202s (queued, rescheduling); anything else is the current status.
    return FastJSONResponse(
        operation_view(task, f"wake requested; the task is {task.status.value}")
    )


def _queued(task: Task) -> JSONResponse:
    body = {
        "id": task.id,
        "status": "queued",
        "message": f"its card is lent to {task.lent_to}: the scheduler wakes it when that "
        "task ends",
    }
    return FastJSONResponse(body, status_code=202)


def _rescheduling(task_id: str) -> JSONResponse:
    body = {
        "id": task_id,
        "status": "rescheduling",
        "message": "host offline: the task goes back to pending to be placed again",
    }
    return FastJSONResponse(body, status_code=202)


async def _wait_for(
    store: EventStore, task_id: str, want: set[TaskStatus], within_s: float
) -> Task:
    deadline = time.monotonic() + within_s
    while True:
        task = await store.get_task(task_id, include_deleted=True)
        if task.status in want or task.status in TERMINAL or time.monotonic() > deadline:
            return task
        await asyncio.sleep(0.1)


async def fetch_logs(request: Request, task: Task, tail: int | None) -> dict[str, Any]:
    nc = request.app.state.nc
    if not task.node_id:
        raise DomainError(
            Code.INVALID_STATUS_FOR_OPERATION,
            f"task has not been placed on a node yet, current status: {task.status.value}",
        )
    if nc is None:
        raise DomainError(Code.NODE_UNREACHABLE, "this gateway has no bus connection")
    body = LogsRequest(task_id=task.id, tail=tail).model_dump_json().encode()
    try:
        reply = await nc.request(
            node_logs_subject(task.node_id), body, timeout=LOG_REQUEST_TIMEOUT_S
        )
    except (NoRespondersError, NatsTimeout, TimeoutError):
        raise DomainError(
            Code.NODE_UNREACHABLE,
            f"node {task.node_id} holding the logs of {task.id} is unreachable",
        ) from None
    logs = LogsReply.model_validate_json(reply.data)
    if not logs.found:
        raise DomainError(
            Code.NOT_FOUND, f"node {task.node_id} has no logs for {task.id} (removed or never ran)"
        )
    return logs.model_dump(exclude={"schema_version"})


SSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the lines (JSON), or with `follow=true` an event stream",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}


@router.get("/tasks/{task_id}/logs", response_model=None, responses=SSE)
async def task_logs(
    request: Request,
    task_id: str,
    principal: Principal,
    store: Store,
    q: Annotated[LogsQuery, Depends(query_of(LogsQuery))],
) -> JSONResponse | StreamingResponse:
    lines, follow = q.lines, q.follow
    task = await store.get_task(task_id, tenant_id=tenant_scope(principal))
    if not follow:
        data = await fetch_logs(request, task, lines)
        return FastJSONResponse({"task_id": task_id, "logs": data["lines"]})
    first = await fetch_logs(request, task, None)  # errors surface before the stream starts
    return StreamingResponse(
        _follow(request, store, task, first["lines"], lines), media_type="text/event-stream"
    )


async def _follow(
    request: Request, store: EventStore, task: Task, seen: list[str], tail: int
) -> AsyncIterator[str]:
    """SSE: the last `tail` lines, then new lines as they come, then an `end` event."""
    sent = len(seen)
    for line in seen[-tail:]:
        yield f"data: {line}\n\n"
    while not await request.is_disconnected():
        current = await store.get_task(task.id, include_deleted=True)
        done = current.status in TERMINAL or current.node_id != task.node_id
        try:
            data = await fetch_logs(request, task, None)
        except DomainError as exc:
            yield f"event: error\ndata: {json.dumps({'error': exc.message})}\n\n"
            return
        for line in data["lines"][sent:]:
            yield f"data: {line}\n\n"
        sent = max(sent, len(data["lines"]))
        if done:
            yield f"event: end\ndata: {json.dumps({'status': current.status.value})}\n\n"
            return
        await asyncio.sleep(0.5)


@router.get("/tasks/{task_id}/retries")
async def task_retries(task_id: str, principal: Principal, store: Store) -> dict[str, Any]:
    task = await store.get_task(task_id, tenant_id=tenant_scope(principal))
    events = [(payload_of(e), e.occurred_at) for e in await store.read_stream(task.id)]
    attempts = retry_history(events)
    return {
        "task_id": task.id,
        "total_retries": task.retry_count,
        "retries": [a.view() for a in attempts],
    }


@router.get("/tasks/{task_id}/events", dependencies=[Depends(query_of(TimelineQuery))])
async def task_events(
    request: Request, task_id: str, principal: Principal, store: Store
) -> dict[str, Any]:
    """The task's fault-tolerance timeline, newest first."""
    page, per_page = timeline.page_params(request)
    task = await store.get_task(task_id, tenant_id=tenant_scope(principal))
    return {"task_id": task.id} | await timeline.task_timeline(store, task.id, page, per_page)


@router.get("/nodes")
async def list_nodes(principal: Principal, store: Store) -> dict[str, Any]:
    require_operator(principal)
    return {"nodes": [n.model_dump(mode="json") for n in await node_rows.all_nodes(store)]}


@router.get("/nodes/{node_id}")
async def get_node(node_id: str, principal: Principal, store: Store, q: AsOf) -> dict[str, Any]:
    """One node (operators), live or `?as_of=` a past time."""
    require_operator(principal)
    at = q.at()
    node = await node_rows.get(store, node_id) if at is None else await node_at(store, node_id, at)
    if node is None:
        raise NotFound("node")
    return node.model_dump(mode="json")


@router.post("/nodes/{node_id}/credentials", status_code=201)
async def register_node(node_id: str, principal: Principal, store: Store) -> dict[str, Any]:
    """Register a node: issue its agent key (shown once; a previous key of the node stops
    working). The key is the agent's API bearer token and its NATS password."""
    require_operator(principal)
    token = await auth.issue_node_credential(store, node_id)
    return {"node_id": node_id, "agent_token": token, "nats_user": auth.nats_user(node_id)}


@router.post("/nodes/join-tokens", status_code=201)
async def issue_join_token(
    principal: Principal,
    store: Store,
    q: Annotated[JoinTokenQuery, Depends(query_of(JoinTokenQuery))],
) -> dict[str, Any]:
    """A one-time token with which one new node registers itself (`?ttl_s=`, default 1 h)."""
    require_operator(principal)
    now = datetime.now(UTC)
    token, expires = await auth.issue_join_token(store, timedelta(seconds=q.ttl_s), now)
    return {"join_token": token, "expires_at": expires.isoformat()}


@router.post("/nodes/{node_id}/join", status_code=201)
async def join_node(request: Request, node_id: str, store: Store) -> dict[str, Any]:
    """A node registers itself with a join token (`Authorization: Bearer hf_jt_…`) and gets
    its key once; the token is spent."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise DomainError(Code.UNAUTHENTICATED, "missing join token (Authorization: Bearer)")
    key = await auth.join_node(store, token.strip(), node_id, datetime.now(UTC))
    return {"node_id": node_id, "agent_token": key, "nats_user": auth.nats_user(node_id)}
