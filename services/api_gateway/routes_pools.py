"""`/api/v1/pools`: resource pools (operators), with capacity computed from matching nodes.

A pool's capacity is never stored: it is the nodes whose labels and cards match the pool's
selector now, less what the GPU-holding tasks on them use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Depends

from libs.domain.errors import Code, Conflict, DomainError, NotFound
from libs.domain.node.model import Node, NodeStatus
from libs.domain.payload import Payload
from libs.domain.pool.decide import parse_pool
from libs.domain.pool.events import PoolCreated, PoolDeleted, PoolUpdated
from libs.domain.pool.model import Pool, PoolSpec, pool_stream
from libs.domain.task.model import Task
from libs.store import nodes as node_rows
from libs.store import pools as pool_rows
from libs.store import queues as queue_rows
from libs.store import tasks as task_rows
from libs.store.projections import POOLS

from . import request_docs
from .deps import Principal, Store, require_operator
from .schemas import documented_body

router = APIRouter(prefix="/api/v1/pools", tags=["pools"])
Body = Annotated[dict[str, Any], Depends(documented_body(request_docs.pool))]
UpdateBody = Annotated[dict[str, Any], Depends(documented_body(request_docs.pool_update))]


def members(pool: PoolSpec, nodes: Sequence[Node]) -> list[Node]:
    sel = pool.node_selector
    return [
        n
        for n in nodes
        if sel.matches(n.inventory.labels, ((g.vendor, g.model) for g in n.inventory.gpus))
    ]


def node_usage(node: Node, holding: Sequence[Task]) -> dict[str, Any]:
    excluded = set(node.excluded_gpus)
    cards = [g.id for g in node.inventory.gpus if g.id not in excluded]
    on_node = [t for t in holding if t.node_id == node.id]
    used_cards = {g for t in on_node for g in t.gpu_ids} & set(cards)
    used_memory = sum(t.spec.memory_mb for t in on_node)
    return {
        "id": node.id,
        "status": node.status.value,
        "gpu_models": sorted({g.model for g in node.inventory.gpus}),
        "labels": dict(node.inventory.labels),
        "total_gpus": len(cards),
        "used_gpus": len(used_cards),
        "total_memory_mb": node.inventory.memory_mb,
        "used_memory_mb": used_memory,
        "tasks": len(on_node),
    }


def capacity(usages: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Totals over online members (an offline node offers nothing)."""
    online = [u for u in usages if u["status"] == NodeStatus.ONLINE.value]
    total = sum(u["total_gpus"] for u in online)
    memory = sum(u["total_memory_mb"] for u in online)
    return {
        "nodes": len(usages),
        "online_nodes": len(online),
        "total_gpus": total,
        "free_gpus": total - sum(u["used_gpus"] for u in online),
        "total_memory_mb": memory,
        "free_memory_mb": max(0, memory - sum(u["used_memory_mb"] for u in online)),
    }


def pool_view(pool: Pool, usages: Sequence[dict[str, Any]], *, detail: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": pool.spec.name,
        "node_selector": pool.spec.node_selector.model_dump(mode="json"),
        "description": pool.spec.description,
        "capacity": capacity(usages),
        "version": pool.version,
        "created_at": pool.created_at.isoformat(),
        "updated_at": pool.updated_at.isoformat(),
    }
    if detail:
        body["nodes"] = list(usages)
    return body


async def _usages(store: Store, pool: PoolSpec) -> list[dict[str, Any]]:
    nodes = members(pool, await node_rows.all_nodes(store))
    holding = await task_rows.holding(store) if nodes else []
    return [node_usage(n, holding) for n in nodes]


async def _load(store: Store, name: str) -> Pool:
    pool = await pool_rows.get(store, name)
    if pool is None:
        raise NotFound("pool")
    return pool


@router.post("", status_code=201)
async def create_pool(principal: Principal, store: Store, body: Body) -> dict[str, Any]:
    require_operator(principal)
    spec = parse_pool(body)

    def decide(current: Pool | None) -> list[Payload]:
        if current is not None and current.deleted_at is None:
            raise Conflict(f"pool {spec.name!r} already exists")
        return [PoolCreated(spec=spec)]

    pool = await store.execute_aggregate(
        POOLS, pool_stream(spec.name), decide, metadata={"principal": principal.subject}
    )
    assert pool is not None
    return pool_view(pool, await _usages(store, pool.spec), detail=True)


@router.get("")
async def list_pools(principal: Principal, store: Store) -> dict[str, Any]:
    pools = await pool_rows.live(store)
    nodes = await node_rows.all_nodes(store)
    holding = await task_rows.holding(store)
    return {
        "pools": [
            pool_view(p, [node_usage(n, holding) for n in members(p.spec, nodes)], detail=False)
            for p in pools
        ]
    }


@router.get("/{name}")
async def get_pool(name: str, principal: Principal, store: Store) -> dict[str, Any]:
    pool = await _load(store, name)
    return pool_view(pool, await _usages(store, pool.spec), detail=True)


@router.put("/{name}")
async def update_pool(
    name: str, principal: Principal, store: Store, body: UpdateBody
) -> dict[str, Any]:
    require_operator(principal)
    await _load(store, name)
    spec = parse_pool(body, name=name)

    def decide(current: Pool | None) -> list[Payload]:
        if current is None or current.deleted_at is not None:
            raise NotFound("pool")
        return [] if current.spec == spec else [PoolUpdated(spec=spec)]

    pool = await store.execute_aggregate(
        POOLS, pool_stream(name), decide, metadata={"principal": principal.subject}
    )
    assert pool is not None
    return pool_view(pool, await _usages(store, pool.spec), detail=True)


@router.delete("/{name}")
async def delete_pool(name: str, principal: Principal, store: Store) -> dict[str, Any]:
    require_operator(principal)
    await _load(store, name)
    users = sorted(q.spec.name for q in await queue_rows.live(store) if name in q.spec.pools)
    if users:
        raise DomainError(
            Code.INVALID_STATUS_FOR_OPERATION,
            f"pool {name!r} is used by queue(s) {', '.join(users)}: change or delete them first",
            ["name"],
        )

    def decide(current: Pool | None) -> list[Payload]:
        if current is None or current.deleted_at is not None:
            raise NotFound("pool")
        return [PoolDeleted(name=name)]

    await store.execute_aggregate(
        POOLS, pool_stream(name), decide, metadata={"principal": principal.subject}
    )
    return {"name": name, "deleted": True}
