"""Rebuild every projection by replaying the store, and compare with the live tables.

Replay is a fold: tasks are evolved in memory and written once at the end; other
projections are applied event by event (they are few). It runs in one transaction with the
projection tables locked, so readers see either the old rows or the rebuilt ones.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from libs.domain.catalog import parse_payload
from libs.domain.events import Payload

from . import projections
from .eventstore import EventStore
from .migrations import PROJECTION_TABLES
from .types import StoredEvent

EVENT_COLUMNS = (
    "position, event_id, stream_id, stream_type, version, type, schema_version,"
    " payload, occurred_at, metadata"
)


@dataclass(frozen=True)
class ReplayReport:
    events: int
    seconds: float
    differences: dict[str, list[str]]

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else float("inf")


async def snapshot(conn: AsyncConnection[Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """Every projection row keyed by table and id."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for table in PROJECTION_TABLES:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(f"SELECT * FROM {table}")
            out[table] = {str(r["id"]): dict(r) for r in await cur.fetchall()}
    return out


def diff(
    before: dict[str, dict[str, dict[str, Any]]], after: dict[str, dict[str, dict[str, Any]]]
) -> dict[str, list[str]]:
    """Row ids that differ per table (missing, extra or changed)."""
    result: dict[str, list[str]] = {}
    for table in PROJECTION_TABLES:
        a, b = before.get(table, {}), after.get(table, {})
        ids = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        if ids:
            result[table] = ids
    return result


async def _fold(conn: AsyncConnection[Any], batch: int = 5000) -> int:
    folded: dict[str, dict[str, Any]] = {t: {} for t in projections.AGGREGATES}
    count = 0
    last = 0
    while True:
        cur = await conn.execute(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE position > %s ORDER BY position LIMIT %s",
            (last, batch),
        )
        rows = await cur.fetchall()
        if not rows:
            break
        for r in rows:
            st = StoredEvent(*r)
            payload: Payload = parse_payload(st.type, st.payload)
            agg = projections.AGGREGATES.get(st.stream_type)
            if agg is not None:
                states = folded[st.stream_type]
                states[st.stream_id] = agg.evolve(
                    states.get(st.stream_id), payload, st.occurred_at, st.version
                )
            else:
                await projections.apply_other(conn, st, payload)
        count += len(rows)
        last = rows[-1][0]
    for stream_type, states in folded.items():
        await projections.upsert(conn, projections.AGGREGATES[stream_type], states.values())
    return count


async def rebuild(store: EventStore, *, dry_run: bool = False) -> ReplayReport:
    """Replay all events into the projections; report rows that differed from the live ones.

    With `dry_run` the rebuilt rows are compared and then rolled back.
    """
    async with store.pool.connection() as conn, conn.transaction(force_rollback=dry_run):
        tables = ", ".join(PROJECTION_TABLES)
        await conn.execute(f"LOCK TABLE {tables} IN EXCLUSIVE MODE")
        before = await snapshot(conn)
        for table in PROJECTION_TABLES:
            await conn.execute(f"DELETE FROM {table}")
        started = time.perf_counter()
        count = await _fold(conn)
        seconds = time.perf_counter() - started
        after = await snapshot(conn)
    return ReplayReport(count, seconds, diff(before, after))
