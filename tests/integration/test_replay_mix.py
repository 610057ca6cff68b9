"""Replay over a generated store of every event kind, against live rows, in a real PostgreSQL.

The unit test (tests/unit/test_replay_fold.py) holds replay's fold equal to the live path in
memory; this one runs `rebuild` itself: the events written with COPY, the live projections
written by the live path's own functions (each aggregate's `evolve` and upsert, and
`apply_other` for tenants, keys and join tokens, in store order), then a dry replay must read
them back, fold, COPY and compare with no difference, timestamps and JSON documents included.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from libs.store import projections
from libs.store.eventstore import EventStore
from libs.store.replay import rebuild
from libs.store.types import StoredEvent
from tests.unit.replay_events import Event, generate

pytestmark = pytest.mark.integration

EVENTS = 20_000


async def _write(conn: AsyncConnection[Any], events: list[Event]) -> None:
    async with conn.cursor().copy(
        "COPY events (event_id, stream_id, stream_type, version, type, schema_version,"
        " payload, metadata, occurred_at) FROM STDIN"
    ) as copy:
        for ev in events:
            version = int(ev.stored.get("schema_version", 1))
            row = (uuid.uuid4(), ev.stream_id, ev.stream_type, ev.version, ev.type, version)
            await copy.write_row((*row, Jsonb(ev.stored), Jsonb({}), ev.at))
    states: dict[str, dict[str, Any]] = {t: {} for t in projections.AGGREGATES}
    for n, ev in enumerate(events, start=1):
        agg = projections.AGGREGATES.get(ev.stream_type)
        if agg is None:
            stored = StoredEvent(
                position=n,
                event_id=uuid.uuid4(),
                stream_id=ev.stream_id,
                stream_type=ev.stream_type,
                version=ev.version,
                type=ev.type,
                payload=ev.stored,
                occurred_at=ev.at,
            )
            await projections.apply_other(conn, stored, ev.payload)
            continue
        mine = states[ev.stream_type]
        mine[ev.stream_id] = agg.evolve(mine.get(ev.stream_id), ev.payload, ev.at, ev.version)
    for stream_type, agg in projections.AGGREGATES.items():
        await projections.upsert(conn, agg, states[stream_type].values())


async def test_replay_of_every_kind_matches_the_live_rows(database_url: str) -> None:
    events = generate(EVENTS)
    store = await EventStore.open(database_url, max_size=2)
    try:
        async with store.pool.connection() as conn, conn.transaction():
            await _write(conn, events)
        report = await rebuild(store, dry_run=True)
        assert report.events == len(events)
        assert report.differences == {}
        async with store.pool.connection() as conn:
            cur = await conn.execute(
                "UPDATE tasks SET doc = jsonb_set(doc, '{started_at}', '\"2000-01-01T00:00:00Z\"')"
                " WHERE id = (SELECT min(id) FROM tasks WHERE doc->>'started_at' IS NOT NULL)"
                " RETURNING id"
            )
            (tampered,) = await cur.fetchone() or (None,)
        assert (await rebuild(store, dry_run=True)).differences == {"tasks": [tampered]}
    finally:
        await store.close()
