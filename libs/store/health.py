"""Whether the database answers: the store's half of a process's readiness probe."""

from __future__ import annotations

import asyncio

import psycopg

from .eventstore import EventStore


async def answers(store: EventStore, timeout_s: float = 2.0) -> bool:
    """True when a pooled connection runs a trivial query within `timeout_s`."""
    try:
        async with asyncio.timeout(timeout_s), store.pool.connection() as conn:
            await conn.execute("SELECT 1")
    except (TimeoutError, psycopg.Error):  # PoolTimeout and PoolClosed are psycopg errors
        return False
    return True
