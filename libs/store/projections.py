"""Projections: read-model rows derived from events, written in the append transaction.

The same functions serve the live path (one stream at a time, inside the CAS transaction)
and replay (a fold over the whole store). Rows are built only from event data, never from
the clock, so a rebuild gives identical tables.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from libs.domain.events import (
    ApiKeyIssued,
    ApiKeyRevoked,
    Payload,
    SystemCredentialIssued,
    TenantCreated,
)
from libs.domain.task import Task

from .types import StoredEvent

TASK_COLUMNS = (
    "id, tenant_id, status, name, node_id, priority, group_id, labels, version,"
    " created_at, updated_at, deleted_at, doc"
)

UPSERT_TASK = f"""
INSERT INTO tasks ({TASK_COLUMNS})
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (id) DO UPDATE SET
    status = EXCLUDED.status, name = EXCLUDED.name, node_id = EXCLUDED.node_id,
    priority = EXCLUDED.priority, group_id = EXCLUDED.group_id, labels = EXCLUDED.labels,
    version = EXCLUDED.version, updated_at = EXCLUDED.updated_at,
    deleted_at = EXCLUDED.deleted_at, doc = EXCLUDED.doc
"""


def task_row(task: Task) -> tuple[Any, ...]:
    return (
        task.id,
        task.tenant_id,
        task.status.value,
        task.spec.name,
        task.node_id,
        task.spec.priority,
        task.group_id,
        Jsonb(task.spec.labels),
        task.version,
        task.created_at,
        task.updated_at,
        task.deleted_at,
        Jsonb(task.model_dump(mode="json")),
    )


async def upsert_tasks(conn: AsyncConnection[Any], tasks: Iterable[Task]) -> None:
    rows = [task_row(t) for t in tasks]
    if rows:
        async with conn.cursor() as cur:
            await cur.executemany(UPSERT_TASK, rows)


async def apply_other(conn: AsyncConnection[Any], stored: StoredEvent, payload: Payload) -> None:
    """Project a non-task event (tenants, API keys, system credentials)."""
    at = stored.occurred_at
    if isinstance(payload, TenantCreated):
        await conn.execute(
            "INSERT INTO tenants (id, name, gpu_quota, created_at) VALUES (%s, %s, %s, %s)",
            (payload.tenant_id, payload.name, payload.gpu_quota, at),
        )
    elif isinstance(payload, ApiKeyIssued):
        await conn.execute(
            "INSERT INTO api_keys (id, tenant_id, name, prefix, key_hash, created_at)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            (payload.key_id, payload.tenant_id, payload.name, payload.prefix, payload.key_hash, at),
        )
    elif isinstance(payload, ApiKeyRevoked):
        await conn.execute(
            "UPDATE api_keys SET revoked_at = %s WHERE id = %s AND tenant_id = %s",
            (at, payload.key_id, payload.tenant_id),
        )
    elif isinstance(payload, SystemCredentialIssued):
        await conn.execute(
            "INSERT INTO system_credentials (id, role, name, prefix, key_hash, created_at)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            (
                payload.credential_id,
                payload.role,
                payload.name,
                payload.prefix,
                payload.key_hash,
                at,
            ),
        )
    else:
        raise ValueError(f"no projection for event type {stored.type}")
