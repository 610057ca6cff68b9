"""Read-side queries over the projections (list, stats, credentials lookups)."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from libs.domain.states import TaskStatus
from libs.domain.task import Task

from .eventstore import EventStore
from .types import TaskQuery

SORT_COLUMNS = {"created_at": "created_at", "updated_at": "updated_at", "priority": "priority"}


async def list_tasks(store: EventStore, q: TaskQuery) -> tuple[list[Task], int]:
    where = ["deleted_at IS NULL"]
    params: list[Any] = []
    if q.tenant_id is not None:
        where.append("tenant_id = %s")
        params.append(q.tenant_id)
    if q.status:
        where.append("status = %s")
        params.append(q.status)
    if q.node_id:
        where.append("node_id = %s")
        params.append(q.node_id)
    if q.name:
        # A search, as in V2: case-insensitive substring; LIKE wildcards in input are literal.
        escaped = q.name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        where.append("name ILIKE %s")
        params.append(f"%{escaped}%")
    if q.labels:
        where.append("labels @> %s")
        params.append(Jsonb(q.labels))
    if q.group_id:
        where.append("group_id = %s")
        params.append(q.group_id)
    clause = " AND ".join(where)
    column = SORT_COLUMNS[q.sort]
    direction = "ASC" if q.order == "asc" else "DESC"
    sql = (
        f"SELECT doc, count(*) OVER () AS total FROM tasks WHERE {clause}"
        f" ORDER BY {column} {direction}, id {direction} LIMIT %s OFFSET %s"
    )
    rows = await store.fetch(sql, [*params, q.per_page, (q.page - 1) * q.per_page])
    if rows:
        return [Task.model_validate(r["doc"]) for r in rows], int(rows[0]["total"])
    count = await store.fetch(f"SELECT count(*) AS n FROM tasks WHERE {clause}", params)
    return [], int(count[0]["n"])


async def task_stats(store: EventStore, tenant_id: str | None) -> dict[str, int]:
    """Counts by status (every status listed, zeros included), scoped like the task list."""
    where = "deleted_at IS NULL" + (" AND tenant_id = %s" if tenant_id is not None else "")
    params = [tenant_id] if tenant_id is not None else []
    rows = await store.fetch(
        f"SELECT status, count(*) AS n FROM tasks WHERE {where} GROUP BY status", params
    )
    counts = {s.value: 0 for s in TaskStatus}
    for r in rows:
        counts[r["status"]] = int(r["n"])
    return counts


async def find_api_key(store: EventStore, key_hash: str) -> dict[str, Any] | None:
    rows = await store.fetch(
        "SELECT k.id, k.tenant_id, k.name FROM api_keys k"
        " WHERE k.key_hash = %s AND k.revoked_at IS NULL",
        [key_hash],
    )
    return rows[0] if rows else None


async def find_system_credential(store: EventStore, key_hash: str) -> dict[str, Any] | None:
    rows = await store.fetch(
        "SELECT id, role, name FROM system_credentials WHERE key_hash = %s", [key_hash]
    )
    return rows[0] if rows else None


async def get_tenant(store: EventStore, tenant_id: str) -> dict[str, Any] | None:
    rows = await store.fetch(
        "SELECT id, name, gpu_quota, created_at FROM tenants WHERE id = %s", [tenant_id]
    )
    return rows[0] if rows else None


async def list_tenants(store: EventStore) -> list[dict[str, Any]]:
    return await store.fetch("SELECT id, name, gpu_quota, created_at FROM tenants ORDER BY id")


async def list_api_keys(store: EventStore, tenant_id: str) -> list[dict[str, Any]]:
    return await store.fetch(
        "SELECT id, name, prefix, created_at, revoked_at FROM api_keys WHERE tenant_id = %s"
        " ORDER BY created_at",
        [tenant_id],
    )
