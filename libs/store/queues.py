"""Reads of the `queues` projection: one queue, a tenant's queues, its default queue, all.

Rows are written only by the append path (`eventstore` + `projections`).
"""

from __future__ import annotations

from libs.domain.pool.model import Queue, queue_stream

from .eventstore import EventStore
from .pool import rows


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
        "SELECT doc FROM queues WHERE deleted_at IS NULL AND tenant_id = %s"
        " AND (doc->'spec'->>'default')::boolean ORDER BY name LIMIT 1",
        [tenant_id],
    )
    return Queue.model_validate(found[0]["doc"]) if found else None
