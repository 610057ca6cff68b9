"""Owner of `relay_dead_letters`: events the outbox relay could never publish.

An event lands here when JetStream refuses it for good (larger than the server's payload
limit or the stream's message size): the relay records it and goes on, so one event can
never halt publishing for every tenant. The event itself stays in `events` (the store is
the truth); an operator reads this table with `heteroflow events dead-letters` and, once the
cause is fixed, publishes it again with `heteroflow events republish --from P --to P`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from .eventstore import EventStore
from .pool import rows

_RECORD = """
INSERT INTO relay_dead_letters
    (relay, event_id, position, stream_id, stream_type, type, subject, size_bytes, error)
VALUES (%(relay)s, %(event_id)s, %(position)s, %(stream_id)s, %(stream_type)s, %(type)s,
        %(subject)s, %(size_bytes)s, %(error)s)
ON CONFLICT (relay, event_id) DO NOTHING
"""

_LIST = """
SELECT relay, event_id, position, stream_id, stream_type, type, subject, size_bytes, error,
       dead_at
FROM relay_dead_letters
ORDER BY dead_at DESC, position DESC
LIMIT %s
"""


@dataclass(frozen=True)
class DeadLetter:
    relay: str
    event_id: UUID
    position: int
    stream_id: str
    stream_type: str
    type: str
    subject: str
    size_bytes: int
    error: str
    dead_at: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"event_id": str(self.event_id)}


async def record(conn: psycopg.AsyncConnection[Any], letter: DeadLetter) -> None:
    """Record on the relay's own connection (autocommit); a second record of the same event
    by the same relay (a crash before its checkpoint moved) changes nothing."""
    params = asdict(letter)
    params.pop("dead_at")
    await conn.execute(_RECORD, params)


async def list_dead_letters(store: EventStore, limit: int = 100) -> list[DeadLetter]:
    """The newest dead letters first."""
    return [DeadLetter(**row) for row in await rows(store, _LIST, (limit,))]
