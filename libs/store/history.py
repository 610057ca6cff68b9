"""The event log read whole, in the order it was written, for the history checker.

One server-side cursor in one transaction: the checker sees a single snapshot of the log
however long it takes, and holds one page in memory at a time. Payloads come as the stored
JSON text (the checker parses them with pydantic-core, as replay does).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from libs.domain.invariants import LoggedEvent

from .eventstore import EventStore

PAGE = 5_000

SELECT_LOG = (
    "SELECT position, event_id::text, stream_id, stream_type, version, type, payload::text,"
    " occurred_at FROM events ORDER BY position"
)


async def log_pages(store: EventStore, page: int = PAGE) -> AsyncGenerator[list[LoggedEvent], None]:
    """Every event, oldest position first, `page` at a time."""
    async with (
        store.pool.connection() as conn,
        conn.transaction(),
        conn.cursor(name="history_log") as cur,
    ):
        await cur.execute(SELECT_LOG)
        while found := await cur.fetchmany(page):
            yield [LoggedEvent(*r) for r in found]
