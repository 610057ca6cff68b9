"""Aggregates as they stood at a past time, folded from the event log (`?as_of=`).

A stream's events up to `at` (by `occurred_at`, in version order) are evolved with the same
function the live projection uses (`projections.AGGREGATES[...].evolve`), so the state
folded up to now equals the projection row as it stands: the row is that fold, written in
the append transaction. An event is in or out by its `occurred_at`, the time its
transaction stamped on it; events of one transaction share it, so no fold stops halfway
through a transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from libs.domain.catalog import PAYLOAD_TYPES

from .eventstore import EventStore
from .projections import AGGREGATES

SELECT_UP_TO = (
    "SELECT stream_id, version, type, payload::text, occurred_at FROM events"
    " WHERE stream_type = %s AND stream_id = ANY(%s) AND occurred_at <= %s"
    " ORDER BY stream_id, version"
)


async def fold_up_to(
    store: EventStore, stream_type: str, ids: Sequence[str], at: datetime
) -> dict[str, Any]:
    """id → the aggregate after its events up to `at`; an id with none then is absent."""
    evolve = AGGREGATES[stream_type].evolve
    states: dict[str, BaseModel] = {}
    async with store.pool.connection() as conn:
        cur = await conn.execute(SELECT_UP_TO, (stream_type, list(ids), at))
        for stream_id, version, event_type, text, occurred_at in await cur.fetchall():
            payload = PAYLOAD_TYPES[event_type].model_validate_json(text)
            states[stream_id] = evolve(states.get(stream_id), payload, occurred_at, version)
    return states


async def one_up_to(store: EventStore, stream_type: str, stream_id: str, at: datetime) -> Any:
    """The aggregate after its events up to `at`, or None if it had none then."""
    return (await fold_up_to(store, stream_type, [stream_id], at)).get(stream_id)
