"""Rebuild every projection by replaying the store, and compare with the live tables.

The fold runs inside one transaction into temporary tables that shadow the projection tables
(PostgreSQL searches `pg_temp` first), so the same projection code writes the rebuilt rows.
Aggregates are evolved in memory (replay_fold.py: tasks as plain documents, the others
through their models) and written once with COPY; tenants and keys are applied event by
event with their SQL (they are few). The comparison is SQL `EXCEPT` both ways; unless it is
a dry run the live tables are then replaced, with the projection tables locked so readers
see either the old rows or the rebuilt ones.

The timeline is not a projection (it is written by the event-timeline service and capped),
so it is not rebuilt; it is compared: an entry that no committed event explains is reported
under `timeline` and left in place (it is evidence, not a cache).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection

from libs.domain.catalog import PAYLOAD_TYPES
from libs.domain.payload import Payload

from . import projections, timeline
from .eventstore import EventStore
from .migrations import PROJECTION_TABLES
from .replay_fold import ReplayFold
from .types import StoredEvent

STREAM_CHUNK = 2_000
# Timeline entries listed by id at most (the count of all is in the report).
TIMELINE_LISTED = 1_000


@dataclass(frozen=True)
class ReplayReport:
    events: int
    seconds: float
    differences: dict[str, list[str]]
    timeline_unsourced: int = 0

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else float("inf")


def _parse(event_type: str, text: str) -> Payload:
    # Parsing JSON text in pydantic-core skips building an intermediate dict.
    return PAYLOAD_TYPES[event_type].model_validate_json(text)


async def _fold(conn: AsyncConnection[Any]) -> int:
    fold = ReplayFold()
    count = 0
    apply = fold.apply
    async with conn.cursor() as cur:
        # Streamed in chunks rather than fetched in batches: the server sends the next rows
        # while these are folded (with batches it sat idle while we folded, and we while it
        # read), and only the columns the fold needs are parsed.
        async for r in cur.stream(
            "SELECT stream_id, stream_type, version, type, payload::text, occurred_at"
            " FROM events ORDER BY position",
            size=STREAM_CHUNK,
        ):
            count += 1
            apply(r[0], r[1], r[2], r[3], r[4], r[5])
        # Tenants, keys and join tokens (not aggregates, skipped by the fold) are few; their
        # tables depend on no aggregate, so they are projected afterwards, in their own order.
        await cur.execute(
            "SELECT position, event_id, stream_id, stream_type, version, type, schema_version,"
            " payload::text, occurred_at FROM events WHERE stream_type <> ALL(%s)"
            " ORDER BY position",
            (list(projections.AGGREGATES),),
        )
        for r in await cur.fetchall():
            stored = StoredEvent.model_construct(
                position=r[0],
                event_id=r[1],
                stream_id=r[2],
                stream_type=r[3],
                version=r[4],
                type=r[5],
                schema_version=r[6],
                payload={},  # parsed once, from the text, for the projection
                occurred_at=r[8],
            )
            await projections.apply_other(conn, stored, _parse(r[5], r[7]))
    for table, rows_of in fold.tables():
        async with conn.cursor().copy(f"COPY {table} FROM STDIN") as copy:
            for row in rows_of:
                await copy.write_row(row)
    return count


async def _differences(conn: AsyncConnection[Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for table in PROJECTION_TABLES:
        cur = await conn.execute(
            f"SELECT id FROM ((TABLE public.{table} EXCEPT TABLE pg_temp.{table})"
            f" UNION (TABLE pg_temp.{table} EXCEPT TABLE public.{table})) d ORDER BY id"
        )
        ids = sorted({str(r[0]) for r in await cur.fetchall()})
        if ids:
            out[table] = ids
    return out


async def rebuild(store: EventStore, *, dry_run: bool = False) -> ReplayReport:
    """Replay all events into the projections; report rows that differed from the live ones.

    With `dry_run` the live tables are left as they are.
    """
    async with store.pool.connection() as conn, conn.transaction(force_rollback=dry_run):
        tables = ", ".join(f"public.{t}" for t in PROJECTION_TABLES)
        await conn.execute(f"LOCK TABLE {tables} IN EXCLUSIVE MODE")
        for table in PROJECTION_TABLES:
            await conn.execute(
                f"CREATE TEMP TABLE {table} (LIKE public.{table} INCLUDING DEFAULTS"
                " INCLUDING INDEXES) ON COMMIT DROP"
            )
        started = time.perf_counter()
        count = await _fold(conn)
        differences = await _differences(conn)
        seconds = time.perf_counter() - started  # fold, write and compare
        rebuilt = bool(differences)
        unsourced, total = await timeline.unsourced_in(conn, TIMELINE_LISTED)
        if unsourced:
            differences["timeline"] = [e.id for e in unsourced]
        if not dry_run and rebuilt:
            for table in PROJECTION_TABLES:  # children first (foreign keys)
                await conn.execute(f"DELETE FROM public.{table}")
            for table in reversed(PROJECTION_TABLES):
                await conn.execute(f"INSERT INTO public.{table} SELECT * FROM pg_temp.{table}")
    return ReplayReport(count, seconds, differences, total)
