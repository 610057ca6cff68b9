"""`/api/v1/queues`: operators create queues bound to pools; tenants see their own.

A queue's usage (cards, running tasks and jobs against its quota) and its pending backlog are
read from the tasks it holds now, never stored.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from libs.domain.errors import Code, Conflict, DomainError, NotFound
from libs.domain.payload import Payload
from libs.domain.pool.decide import parse_queue
from libs.domain.pool.events import QueueCreated, QueueDeleted, QueueUpdated
from libs.domain.pool.model import Queue, QueueSpec, queue_stream
from libs.store import pools as pool_rows
from libs.store import queues as queue_rows
from libs.store import tasks as task_rows
from libs.store import tenants
from libs.store.projections import QUEUES

from . import request_docs
from .deps import Principal, Store, require_operator, tenant_scope
from .schemas import documented_body

router = APIRouter(prefix="/api/v1/queues", tags=["queues"])
Body = Annotated[dict[str, Any], Depends(documented_body(request_docs.queue))]
UpdateBody = Annotated[dict[str, Any], Depends(documented_body(request_docs.queue_update))]


def queue_view(queue: Queue, usage: dict[str, float] | None = None) -> dict[str, Any]:
    spec = queue.spec
    body: dict[str, Any] = {
        **spec.model_dump(mode="json"),
        "version": queue.version,
        "created_at": queue.created_at.isoformat(),
        "updated_at": queue.updated_at.isoformat(),
    }
    if usage is not None:
        body["usage"] = {
            "gpus": usage["gpus"],
            "running_tasks": int(usage["running_tasks"]),
            "running_jobs": int(usage["running_jobs"]),
        }
        body["pending"] = int(usage["pending"])
    return body


async def _check_refs(store: Store, spec: QueueSpec) -> None:
    """The tenant and every pool exist; a tenant has at most one default queue."""
    if await tenants.get_tenant(store, spec.tenant) is None:
        raise DomainError(Code.INVALID_VALUE, f"unknown tenant {spec.tenant!r}", ["tenant"])
    missing = [p for p in spec.pools if await pool_rows.get(store, p) is None]
    if missing:
        raise DomainError(Code.INVALID_VALUE, f"unknown pool(s): {', '.join(missing)}", ["pools"])
    if spec.default:
        other = await queue_rows.default_of(store, spec.tenant)
        if other is not None and other.spec.name != spec.name:
            raise DomainError(
                Code.INVALID_VALUE,
                f"tenant {spec.tenant!r} already has default queue {other.spec.name!r}",
                ["default"],
            )


async def _load(store: Store, name: str, tenant: str | None) -> Queue:
    queue = await queue_rows.get(store, name)
    if queue is None or (tenant is not None and queue.spec.tenant != tenant):
        raise NotFound("queue")
    return queue


@router.post("", status_code=201)
async def create_queue(principal: Principal, store: Store, body: Body) -> dict[str, Any]:
    require_operator(principal)
    spec = parse_queue(body)
    await _check_refs(store, spec)

    def decide(current: Queue | None) -> list[Payload]:
        if current is not None and current.deleted_at is None:
            raise Conflict(f"queue {spec.name!r} already exists")
        return [QueueCreated(spec=spec)]

    queue = await store.execute_aggregate(
        QUEUES, queue_stream(spec.name), decide, metadata={"principal": principal.subject}
    )
    assert queue is not None
    return queue_view(queue)


@router.get("")
async def list_queues(principal: Principal, store: Store) -> dict[str, Any]:
    found = await queue_rows.live(store, tenant_scope(principal))
    return {"queues": [queue_view(q) for q in found]}


@router.get("/{name}")
async def get_queue(name: str, principal: Principal, store: Store) -> dict[str, Any]:
    queue = await _load(store, name, tenant_scope(principal))
    return queue_view(queue, await task_rows.queue_usage(store, name))


@router.put("/{name}")
async def update_queue(
    name: str, principal: Principal, store: Store, body: UpdateBody
) -> dict[str, Any]:
    require_operator(principal)
    current = await _load(store, name, None)
    spec = parse_queue(body, current=current.spec)
    await _check_refs(store, spec)

    def decide(now: Queue | None) -> list[Payload]:
        if now is None or now.deleted_at is not None:
            raise NotFound("queue")
        return [] if now.spec == spec else [QueueUpdated(spec=spec)]

    queue = await store.execute_aggregate(
        QUEUES, queue_stream(name), decide, metadata={"principal": principal.subject}
    )
    assert queue is not None
    return queue_view(queue, await task_rows.queue_usage(store, name))


@router.delete("/{name}")
async def delete_queue(name: str, principal: Principal, store: Store) -> dict[str, Any]:
    require_operator(principal)
    await _load(store, name, None)

    def decide(current: Queue | None) -> list[Payload]:
        if current is None or current.deleted_at is not None:
            raise NotFound("queue")
        return [QueueDeleted(name=name)]

    await store.execute_aggregate(
        QUEUES, queue_stream(name), decide, metadata={"principal": principal.subject}
    )
    return {"name": name, "deleted": True}
