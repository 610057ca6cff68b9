"""Exactly once, one way: the `consumer_inbox` table and its queries.

An event consumer that writes passes a `Receipt` (its name and the event id) to the store
call that makes its effect; the store records it in the same transaction. A redelivered or
republished event finds its receipt, and the call changes nothing. When the effect fails the
transaction rolls back with the receipt, so the redelivery tries again.

Receipts are kept longer than the events stream keeps a message (30 days, see
libs/bus/subjects.py), so nothing JetStream can redeliver has lost its receipt. A republish of
events older than that is handled again (docs/operations.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

from psycopg import AsyncConnection

if TYPE_CHECKING:
    from .eventstore import EventStore

RETENTION = timedelta(days=31)

RECORD = """
INSERT INTO consumer_inbox (consumer, event_id) VALUES (%s, %s)
ON CONFLICT (consumer, event_id) DO NOTHING
"""

PURGE = "DELETE FROM consumer_inbox WHERE consumer = %s AND handled_at < now() - %s"


@dataclass(frozen=True)
class Receipt:
    """Consumer `consumer` handles event `event_id`."""

    consumer: str
    event_id: UUID

    @classmethod
    def of(cls, consumer: str, envelope: dict[str, Any]) -> Receipt:
        """The receipt for an event envelope as published on the bus."""
        return cls(consumer, UUID(str(envelope["event_id"])))


async def record(conn: AsyncConnection[Any], receipt: Receipt) -> bool:
    """Within the caller's transaction: True when this is the first time, False when the
    consumer has already handled the event (the caller then changes nothing)."""
    cur = await conn.execute(RECORD, (receipt.consumer, receipt.event_id))
    return cur.rowcount == 1


async def purge(store: EventStore, consumer: str, older_than: timedelta = RETENTION) -> int:
    """Forget `consumer`'s receipts older than `older_than`; the number removed."""
    async with store.pool.connection() as conn:
        cur = await conn.execute(PURGE, (consumer, older_than))
        return cur.rowcount
