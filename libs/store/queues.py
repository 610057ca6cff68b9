"""Reads of the `queues` projection: one queue, a tenant's queues, its default queue, all.

Rows are written only by the append path (`eventstore` + `projections`).
"""

from __future__ import annotations

from libs.domain.pool.model import Queue, queue_stream

from .eventstore import EventStore, Guard
from .pool import rows

_DEFAULT = "deleted_at IS NULL AND tenant_id = %s AND (doc->'spec'->>'default')::boolean"


def _queues(found: list[dict[str, object]]) -> list[Queue]:
    return [Queue.model_validate(r["doc"]) for r in found]


async def get(store: EventStore, name: str) -> Queue | None:
    found = await rows(
        store, "SELECT doc FROM queues WHERE id = %s AND deleted_at IS NULL", [queue_stream(name)]
    )
    return Queue.model_validate(found[0]["doc"]) if found else None


async def live(store: EventStore, tenant_id: str | None = None) -> list[Queue]:
    """Every queue not deleted (of one tenant when `tenant_id` is set), by name."""
    if tenant_id is None:
        found = await rows(store, "SELECT doc FROM queues WHERE deleted_at IS NULL ORDER BY name")
    else:
        found = await rows(
            store,
            "SELECT doc FROM queues WHERE deleted_at IS NULL AND tenant_id = %s ORDER BY name",
            [tenant_id],
        )
    return _queues(found)


async def default_of(store: EventStore, tenant_id: str) -> Queue | None:
    """The tenant's queue for work submitted without `queue` (None: it has none)."""
    found = await rows(
        store,
        f"SELECT doc FROM queues WHERE {_DEFAULT} ORDER BY name LIMIT 1",
        [tenant_id],
    )
    return Queue.model_validate(found[0]["doc"]) if found else None


def unchanged(queue: Queue) -> Guard:
    """A create's guard: `queue` is still live at the version it was read at (a spec change,
    a default flag moved or a delete all move it)."""
    return Guard(
        "EXISTS (SELECT 1 FROM queues WHERE id = %s AND version = %s AND deleted_at IS NULL)",
        (queue_stream(queue.spec.name), queue.version),
    )


def no_default(tenant_id: str) -> Guard:
    """A create's guard: the tenant still has no default queue."""
    return Guard(f"NOT EXISTS (SELECT 1 FROM queues WHERE {_DEFAULT})", (tenant_id,))
