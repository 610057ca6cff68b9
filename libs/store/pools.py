"""Reads of the `pools` projection: one pool by name, and every live pool.

Rows are written only by the append path (`eventstore` + `projections`).
"""

from __future__ import annotations

from libs.domain.pool.model import Pool, pool_stream

from .eventstore import EventStore
from .pool import rows


async def get(store: EventStore, name: str) -> Pool | None:
    found = await rows(
        store, "SELECT doc FROM pools WHERE id = %s AND deleted_at IS NULL", [pool_stream(name)]
    )
    return Pool.model_validate(found[0]["doc"]) if found else None


async def live(store: EventStore) -> list[Pool]:
    """Every pool not deleted, by name."""
    found = await rows(store, "SELECT doc FROM pools WHERE deleted_at IS NULL ORDER BY name")
    return [Pool.model_validate(r["doc"]) for r in found]


async def signature(store: EventStore) -> list[tuple[str, int]]:
    """(id, version) of every pool row, deleted ones included: cheap to compare each round."""
    found = await rows(store, "SELECT id, version FROM pools ORDER BY id")
    return [(str(r["id"]), int(r["version"])) for r in found]
