"""Projections: read-model rows derived from events, written in the append transaction.

The same functions serve the live path (one stream at a time, inside the CAS transaction)
and replay (a fold over the whole store). Rows are built only from event data, never from
the clock, so a rebuild gives identical tables.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb
from pydantic import BaseModel

from libs.domain.group.evolve import evolve_group
from libs.domain.group.model import Group
from libs.domain.job.evolve import evolve_job
from libs.domain.job.model import Job
from libs.domain.node.evolve import evolve_node
from libs.domain.node.model import Node
from libs.domain.payload import Payload
from libs.domain.pool.evolve import evolve_pool, evolve_queue
from libs.domain.pool.model import Pool, Queue
from libs.domain.task.evolve import evolve_task
from libs.domain.task.model import Task
from libs.domain.tenant.events import (
    ApiKeyIssued,
    ApiKeyRevoked,
    JoinTokenIssued,
    NodeJoined,
    SystemCredentialIssued,
    TenantCreated,
    TenantUpdated,
)

from .records import columns_of, from_records, records
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


M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Aggregate(Generic[M]):
    """How one aggregate type is folded from its events and stored as a projection row."""

    stream_type: str
    table: str
    model: type[M]
    evolve: Callable[[M | None, Any, datetime, int], M]
    row: Callable[[M], tuple[Any, ...]]
    upsert_sql: str  # one row's; a batch runs `batch_sql`, the same over `records`
    tenant_column: str | None = None
    columns: tuple[str, ...] = field(init=False)
    batch_sql: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", columns_of(self.upsert_sql))
        object.__setattr__(self, "batch_sql", from_records(self.upsert_sql))


def as_jsonb(model: BaseModel) -> Jsonb:
    """A model as a jsonb parameter, serialised by pydantic straight to JSON text (about four
    times cheaper than `model_dump(mode="json")` and then `json.dumps`; the same document)."""
    return Jsonb(model, dumps=_model_json)


def _model_json(model: BaseModel) -> str:
    return model.model_dump_json()


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
        as_jsonb(task),
    )


def node_row(node: Node) -> tuple[Any, ...]:
    return (
        node.id,
        node.status.value,
        node.version,
        node.registered_at,
        node.updated_at,
        Jsonb(node.model_dump(mode="json")),
    )


UPSERT_NODE = """
INSERT INTO nodes (id, status, version, registered_at, updated_at, doc)
VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT (id) DO UPDATE SET
    status = EXCLUDED.status, version = EXCLUDED.version,
    updated_at = EXCLUDED.updated_at, doc = EXCLUDED.doc
"""


def group_row(group: Group) -> tuple[Any, ...]:
    return (
        group.id,
        group.tenant_id,
        group.status.value,
        group.spec.template.name,
        group.version,
        group.created_at,
        group.updated_at,
        group.deleted_at,
        Jsonb(group.model_dump(mode="json")),
    )


UPSERT_GROUP = """
INSERT INTO groups (id, tenant_id, status, name, version, created_at, updated_at, deleted_at, doc)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (id) DO UPDATE SET
    status = EXCLUDED.status, name = EXCLUDED.name, version = EXCLUDED.version,
    updated_at = EXCLUDED.updated_at, deleted_at = EXCLUDED.deleted_at, doc = EXCLUDED.doc
"""

TASKS: Aggregate[Task] = Aggregate(
    "task", "tasks", Task, evolve_task, task_row, UPSERT_TASK, tenant_column="tenant_id"
)
NODES: Aggregate[Node] = Aggregate("node", "nodes", Node, evolve_node, node_row, UPSERT_NODE)
GROUPS: Aggregate[Group] = Aggregate(
    "group", "groups", Group, evolve_group, group_row, UPSERT_GROUP, tenant_column="tenant_id"
)


def pool_row(pool: Pool) -> tuple[Any, ...]:
    return (
        pool.id,
        pool.spec.name,
        pool.version,
        pool.created_at,
        pool.updated_at,
        pool.deleted_at,
        Jsonb(pool.model_dump(mode="json")),
    )


UPSERT_POOL = """
INSERT INTO pools (id, name, version, created_at, updated_at, deleted_at, doc)
VALUES (%s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (id) DO UPDATE SET
    version = EXCLUDED.version, created_at = EXCLUDED.created_at,
    updated_at = EXCLUDED.updated_at, deleted_at = EXCLUDED.deleted_at, doc = EXCLUDED.doc
"""


def queue_row(queue: Queue) -> tuple[Any, ...]:
    return (
        queue.id,
        queue.spec.name,
        queue.spec.tenant,
        queue.version,
        queue.created_at,
        queue.updated_at,
        queue.deleted_at,
        Jsonb(queue.model_dump(mode="json")),
    )


UPSERT_QUEUE = """
INSERT INTO queues (id, name, tenant_id, version, created_at, updated_at, deleted_at, doc)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (id) DO UPDATE SET
    tenant_id = EXCLUDED.tenant_id, version = EXCLUDED.version,
    created_at = EXCLUDED.created_at, updated_at = EXCLUDED.updated_at,
    deleted_at = EXCLUDED.deleted_at, doc = EXCLUDED.doc
"""

POOLS: Aggregate[Pool] = Aggregate("pool", "pools", Pool, evolve_pool, pool_row, UPSERT_POOL)
QUEUES: Aggregate[Queue] = Aggregate(
    "queue", "queues", Queue, evolve_queue, queue_row, UPSERT_QUEUE, tenant_column="tenant_id"
)


def job_row(job: Job) -> tuple[Any, ...]:
    return (
        job.id,
        job.tenant_id,
        job.status.value,
        job.spec.name,
        job.version,
        job.created_at,
        job.updated_at,
        job.deleted_at,
        Jsonb(job.model_dump(mode="json")),
    )


UPSERT_JOB = """
INSERT INTO jobs (id, tenant_id, status, name, version, created_at, updated_at, deleted_at, doc)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (id) DO UPDATE SET
    status = EXCLUDED.status, version = EXCLUDED.version, updated_at = EXCLUDED.updated_at,
    deleted_at = EXCLUDED.deleted_at, doc = EXCLUDED.doc
"""

JOBS: Aggregate[Job] = Aggregate(
    "job", "jobs", Job, evolve_job, job_row, UPSERT_JOB, tenant_column="tenant_id"
)
AGGREGATES: dict[str, Aggregate[Any]] = {
    a.stream_type: a for a in (TASKS, NODES, GROUPS, POOLS, QUEUES, JOBS)
}


def rows_by_id(agg: Aggregate[M], items: Iterable[M]) -> list[tuple[Any, ...]]:
    """The projection rows of `items`, one per id: an id given twice is written once, as its
    last item has it (as one statement per row left it; one `INSERT … ON CONFLICT` may not
    touch a row twice)."""
    return list({(row := agg.row(x))[0]: row for x in items}.values())


async def upsert(conn: AsyncConnection[Any], agg: Aggregate[M], items: Iterable[M]) -> None:
    """Upsert the projection rows of `items`: one statement for the batch (records.py)."""
    rows = rows_by_id(agg, items)
    if rows:
        await conn.execute(agg.batch_sql, (records(agg.columns, rows),))


async def upsert_tasks(conn: AsyncConnection[Any], tasks: Iterable[Task]) -> None:
    await upsert(conn, TASKS, tasks)


async def apply_other(conn: AsyncConnection[Any], stored: StoredEvent, payload: Payload) -> None:
    """Project a non-task event (tenants, API keys, system credentials)."""
    at = stored.occurred_at
    if isinstance(payload, TenantCreated):
        await conn.execute(
            "INSERT INTO tenants (id, name, gpu_quota, created_at) VALUES (%s, %s, %s, %s)",
            (payload.tenant_id, payload.name, payload.gpu_quota, at),
        )
    elif isinstance(payload, TenantUpdated):
        await conn.execute(
            "UPDATE tenants SET suspended = COALESCE(%s, suspended),"
            " gpu_quota = COALESCE(%s, gpu_quota) WHERE id = %s",
            (payload.suspended, payload.gpu_quota, payload.tenant_id),
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
        if payload.node_id is not None:
            # One live key per node: a new one revokes the one it replaces.
            await conn.execute(
                "UPDATE system_credentials SET revoked_at = %s"
                " WHERE node_id = %s AND revoked_at IS NULL",
                (at, payload.node_id),
            )
        await conn.execute(
            "INSERT INTO system_credentials"
            " (id, role, name, prefix, key_hash, created_at, node_id, nats_password_hash)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            (
                payload.credential_id,
                payload.role,
                payload.name,
                payload.prefix,
                payload.key_hash,
                at,
                payload.node_id,
                payload.nats_password_hash,
            ),
        )
    elif isinstance(payload, JoinTokenIssued):
        await conn.execute(
            "INSERT INTO join_tokens (id, prefix, key_hash, created_at, expires_at)"
            " VALUES (%s, %s, %s, %s, %s)",
            (payload.token_id, payload.prefix, payload.key_hash, at, payload.expires_at),
        )
    elif isinstance(payload, NodeJoined):
        await conn.execute(
            "UPDATE join_tokens SET used_at = %s, node_id = %s WHERE id = %s",
            (at, payload.node_id, payload.token_id),
        )
    else:
        raise ValueError(f"no projection for event type {stored.type}")
