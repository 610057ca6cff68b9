"""Fencing tokens, checked by the store: the `fences` table and its one query.

A leader holds a lease (libs/bus/lease.py) whose acquisition revision only grows from one
holder to the next. Every write it makes carries a `Fence` (lease name + that token). In the
transaction of the write, `check` raises the lease's row to the greatest token seen and
refuses the write when that is newer than the writer's: a holder deposed without noticing
(paused, partitioned, slow) cannot commit after its successor has written once.

Why one upsert is enough: the row lock taken by the upsert is held until the writer's commit,
so a newer holder's first write waits for an older holder's transaction in flight, and every
later write of the older holder sees the newer token. See Kleppmann, "How to do distributed
locking" (2016), for why the lease alone cannot give this.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psycopg import AsyncConnection

from libs.domain.errors import Fenced

if TYPE_CHECKING:
    from .eventstore import EventStore

RAISE_FENCE = """
INSERT INTO fences (lease, token) VALUES (%s, %s)
ON CONFLICT (lease) DO UPDATE
    SET token = GREATEST(fences.token, EXCLUDED.token),
        updated_at = CASE WHEN EXCLUDED.token > fences.token THEN now()
                          ELSE fences.updated_at END
RETURNING token
"""

READ_FENCE = "SELECT token FROM fences WHERE lease = %s"
READ_NEWEST = "SELECT max(token) FROM fences"


@dataclass(frozen=True)
class Fence:
    """What a leader's write carries: the lease it acts under and the token it won it with."""

    lease: str
    token: int

    def metadata(self) -> dict[str, Any]:
        """The fence as recorded in the metadata of the events it writes."""
        return {"lease": self.lease, "fencing_token": self.token}


# The fence of the controller term running in this context (set by libs/controller.py for
# everything a term does, including tasks it starts). A store write that names no fence of
# its own carries this one, so code a controller calls cannot write past its term unfenced.
TERM_FENCE: ContextVar[Fence | None] = ContextVar("heteroflow_term_fence", default=None)


def effective(fence: Fence | None) -> Fence | None:
    """The fence a write carries: its own, else its controller term's (None outside one)."""
    return fence if fence is not None else TERM_FENCE.get()


async def check(conn: AsyncConnection[Any], fence: Fence) -> None:
    """Within the caller's transaction: record `fence`, or raise `Fenced` if it is stale.

    The raise leaves the transaction to roll back, so nothing the writer did is kept.
    """
    cur = await conn.execute(RAISE_FENCE, (fence.lease, fence.token))
    row = await cur.fetchone()
    assert row is not None
    newest = int(row[0])
    if newest > fence.token:
        raise Fenced(fence.lease, fence.token, newest)


async def newest_token(conn: AsyncConnection[Any], lease: str) -> int | None:
    """The greatest token the store has seen for `lease` (None: no fenced write yet)."""
    cur = await conn.execute(READ_FENCE, (lease,))
    row = await cur.fetchone()
    return int(row[0]) if row else None


async def newest_of_all(conn: AsyncConnection[Any]) -> int:
    """The greatest token of any lease (0: none yet): the floor below which a lease bucket's
    revisions must not restart (libs/bus/lease.py `raise_revisions`), since every lease of
    the platform lives in one bucket whose revisions it shares."""
    cur = await conn.execute(READ_NEWEST)
    row = await cur.fetchone()
    return int(row[0]) if row and row[0] is not None else 0


async def lease_floor(store: EventStore) -> int:
    """`newest_of_all` on a connection of `store`'s: what a service that opens the lease
    bucket passes as its `floor` (libs/bus/lease.py `open_lease_bucket`)."""
    async with store.pool.connection() as conn:
        return await newest_of_all(conn)
