"""The `timeline` table: fault-tolerance entries written by the event-timeline service,
read newest first by the gateway, capped per subject and purged by age.

Not a projection: replay does not rebuild it. Writes are exactly once through the writer's
receipt (libs/store/inbox.py), recorded in the same transaction as the entries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from . import inbox
from .eventstore import EventStore
from .pool import rows
from .records import columns_of, from_records, records

INSERT = """
INSERT INTO timeline (id, subject_type, subject_id, kind, message, details, occurred_at,
                      source_event)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
"""
INSERT_MANY = from_records(INSERT)  # the entries of one event in one statement (records.py)
COLUMNS = columns_of(INSERT)
TRIM = """
DELETE FROM timeline WHERE id IN (
    SELECT id FROM timeline WHERE subject_type = %s AND subject_id = %s
    ORDER BY occurred_at DESC, id DESC OFFSET %s)
"""
# Entries no committed event explains: the source event is not in the log, or the entry's
# time is not its source event's (entries copy it). Read by the history checker and replay.
UNSOURCED = """
SELECT t.id, t.subject_type, t.subject_id, t.kind, t.source_event::text AS source_event,
       t.occurred_at, e.occurred_at AS event_occurred_at, count(*) OVER () AS total
FROM timeline t LEFT JOIN events e ON e.event_id = t.source_event
WHERE e.event_id IS NULL OR e.occurred_at <> t.occurred_at
ORDER BY t.recorded_at, t.id LIMIT %s
"""
# Subjects whose entries are capped; node entries are only purged by age.
CAPPED = ("task", "group")
# SPEC §6: at most 200 entries per task and per group (the writer's default cap, and what a
# group's timeline read returns at most).
MAX_PER_SUBJECT = 200


class NewEntry(Protocol):
    """What a writer hands in (the event-timeline service's `Entry` has these fields)."""

    @property
    def id(self) -> str: ...
    @property
    def subject_type(self) -> str: ...
    @property
    def subject_id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def message(self) -> str: ...
    @property
    def details(self) -> dict[str, Any]: ...
    @property
    def occurred_at(self) -> datetime: ...
    @property
    def source_event(self) -> str: ...


@dataclass(frozen=True)
class TimelineEntry:
    """An entry as read back (the shape of GET .../events items)."""

    id: str
    subject_type: str
    subject_id: str
    kind: str
    message: str
    details: dict[str, Any]
    occurred_at: datetime


@dataclass(frozen=True)
class UnsourcedEntry:
    """A timeline entry that no committed event explains (`event_occurred_at` None: its
    source event is missing)."""

    id: str
    subject_type: str
    subject_id: str
    kind: str
    source_event: str
    occurred_at: datetime
    event_occurred_at: datetime | None


async def unsourced_in(conn: AsyncConnection[Any], limit: int) -> tuple[list[UnsourcedEntry], int]:
    """At most `limit` unexplained entries, oldest written first, and how many there are."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(UNSOURCED, (limit,))
        found = await cur.fetchall()
    total = int(found[0].pop("total")) if found else 0
    for r in found[1:]:
        del r["total"]
    return [UnsourcedEntry(**r) for r in found], total


async def unsourced(store: EventStore, limit: int = 1000) -> tuple[list[UnsourcedEntry], int]:
    async with store.pool.connection() as conn:
        return await unsourced_in(conn, limit)


async def write(
    store: EventStore, entries: Sequence[NewEntry], cap: int, receipt: inbox.Receipt
) -> bool:
    """Insert entries, then keep each task's and group's newest `cap`, all in one transaction
    with `receipt`; False (nothing written) when the event was handled before."""
    params = [
        (
            e.id,
            e.subject_type,
            e.subject_id,
            e.kind,
            e.message,
            Jsonb(e.details),
            e.occurred_at,
            e.source_event,
        )
        for e in entries
    ]
    async with store.pool.connection() as conn, conn.transaction():
        if not await inbox.record(conn, receipt):
            return False  # handled before: its entries are there (or trimmed, as they should be)
        if params:
            await conn.execute(INSERT_MANY, (records(COLUMNS, params),))
        for subject in {(e.subject_type, e.subject_id) for e in entries}:
            if subject[0] in CAPPED:
                await conn.execute(TRIM, (*subject, cap))
    return True


async def purge(store: EventStore, older_than: timedelta) -> int:
    """Delete entries that occurred more than `older_than` ago; how many went."""
    async with store.pool.connection() as conn:
        cur = await conn.execute(
            "DELETE FROM timeline WHERE occurred_at < now() - %s", (older_than,)
        )
        return cur.rowcount


async def _page(
    store: EventStore, where: str, args: list[Any], page: int, per_page: int
) -> tuple[list[TimelineEntry], int]:
    found = await rows(
        store,
        "SELECT id, subject_type, subject_id, kind, message, details, occurred_at,"
        f" count(*) OVER () AS total FROM timeline WHERE {where}"
        " ORDER BY occurred_at DESC, id DESC LIMIT %s OFFSET %s",
        [*args, per_page, (page - 1) * per_page],
    )
    total = int(found[0]["total"]) if found else 0
    for r in found:
        del r["total"]
    return [TimelineEntry(**r) for r in found], total


async def task_page(
    store: EventStore, task_id: str, page: int, per_page: int
) -> tuple[list[TimelineEntry], int]:
    """A task's entries, newest first, and how many it has."""
    return await _page(
        store, "subject_type = 'task' AND subject_id = %s", [task_id], page, per_page
    )


async def node_page(
    store: EventStore, node_id: str, page: int, per_page: int
) -> tuple[list[TimelineEntry], int]:
    """A node's entries (offline, cards lost, quarantined, restored), newest first."""
    return await _page(
        store, "subject_type = 'node' AND subject_id = %s", [node_id], page, per_page
    )


async def group_page(
    store: EventStore,
    group_id: str,
    member_ids: Sequence[str],
    page: int,
    per_page: int,
    newest: int = MAX_PER_SUBJECT,
) -> tuple[list[TimelineEntry], int]:
    """A group's own entries and those of its member tasks, newest first: the `newest` of
    them together, however many members contributed (each subject is trimmed on its own, so
    the union could otherwise hold `newest` × (members + 1))."""
    found = await rows(
        store,
        "SELECT *, count(*) OVER () AS total FROM ("
        " SELECT id, subject_type, subject_id, kind, message, details, occurred_at"
        " FROM timeline WHERE (subject_type = 'group' AND subject_id = %s)"
        " OR (subject_type = 'task' AND subject_id = ANY(%s))"
        " ORDER BY occurred_at DESC, id DESC LIMIT %s) AS newest"
        " ORDER BY occurred_at DESC, id DESC LIMIT %s OFFSET %s",
        [group_id, list(member_ids), newest, per_page, (page - 1) * per_page],
    )
    total = int(found[0]["total"]) if found else 0
    for r in found:
        del r["total"]
    return [TimelineEntry(**r) for r in found], total
