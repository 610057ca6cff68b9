"""The store's edge: the connection pool every store module reads and writes through.

`StorePool.connection()` translates driver failures into the project's own exceptions
(`libs.domain.errors.StoreUnavailable` / `StoreError`) for everything that happens inside
the `async with` block, so callers above `libs/store` never see a psycopg exception.
Store modules fetch rows with `rows()` / `one()`; nothing outside `libs/store` holds SQL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from libs.domain.errors import StoreError, StoreUnavailable

if TYPE_CHECKING:
    from .eventstore import EventStore


# How long a connection may be waited for in this context (None: the pool's own 30 s). The
# gateway sets it per request, so a request fails fast (503) when the database is away or
# every connection is busy, while the services behind it keep the pool's patient default.
WAIT_TIMEOUT_S: ContextVar[float | None] = ContextVar("store_wait_timeout_s", default=None)


class StorePool(AsyncConnectionPool):
    """An `AsyncConnectionPool` whose connections raise the project's storage errors."""

    # Same signature as the pool's own method (callers pass the pool's wait timeout).
    @asynccontextmanager
    async def connection(
        self,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> AsyncIterator[AsyncConnection[Any]]:
        if timeout is None:
            timeout = WAIT_TIMEOUT_S.get()
        try:
            async with super().connection(timeout) as conn:
                yield conn
        except psycopg.OperationalError as exc:  # PoolTimeout is one of these
            raise StoreUnavailable(f"store unavailable: {exc}") from exc
        except psycopg.Error as exc:
            raise StoreError(f"store error: {exc}") from exc


async def rows(store: EventStore, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """Every row of a read, as dicts (for the store modules).

    One statement in autocommit: without it psycopg wraps the read in BEGIN ... COMMIT,
    three round trips instead of one (and a read alone needs no transaction)."""
    async with (
        store.pool.connection() as conn,
        autocommit(conn),
        conn.cursor(row_factory=dict_row) as cur,
    ):
        await cur.execute(sql, params)
        return list(await cur.fetchall())


@asynccontextmanager
async def autocommit(conn: AsyncConnection[Any]) -> AsyncIterator[None]:
    """`conn` in autocommit for the block (one statement is then its own transaction, with no
    BEGIN or COMMIT round trip), back to transactions after it. Setting the flag on an idle
    connection costs no round trip."""
    await conn.set_autocommit(True)
    try:
        yield
    finally:
        # A broken connection is discarded by the pool; only a live one goes back.
        if conn.info.transaction_status == TransactionStatus.IDLE:
            await conn.set_autocommit(False)


async def one(store: EventStore, sql: str, params: Sequence[Any] = ()) -> dict[str, Any] | None:
    found = await rows(store, sql, params)
    return found[0] if found else None


def contains(text: str) -> str:
    """An ILIKE pattern for a case-insensitive substring; LIKE wildcards in `text` are
    literal (the lists' `name` search, as in V2)."""
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


async def page_of(
    store: EventStore,
    table: str,
    where: Sequence[str],
    params: Sequence[Any],
    order_by: str,
    page: int,
    per_page: int,
) -> tuple[list[dict[str, Any]], int]:
    """One page of `table`'s rows (`doc`) matching every `where` clause, in `order_by`, and
    the total that matches (counted apart when the page is past the end). `table`,
    `where` and `order_by` are the store's own text, never caller input."""
    clause = " AND ".join(where)
    found = await rows(
        store,
        f"SELECT doc, count(*) OVER () AS total FROM {table} WHERE {clause}"
        f" ORDER BY {order_by} LIMIT %s OFFSET %s",
        [*params, per_page, (page - 1) * per_page],
    )
    if found:
        return found, int(found[0]["total"])
    count = await rows(store, f"SELECT count(*) AS n FROM {table} WHERE {clause}", params)
    return [], int(count[0]["n"])


async def live_page(
    store: EventStore,
    table: str,
    tenant_id: str | None,
    status: str | None,
    page: int,
    per_page: int,
) -> tuple[list[dict[str, Any]], int]:
    """One page of `table`'s live rows, newest first, and the total that matches; for the
    aggregate tables with `tenant_id`, `status`, `created_at` and `deleted_at` (jobs)."""
    where, args = ["deleted_at IS NULL"], list[Any]()
    if tenant_id is not None:
        where.append("tenant_id = %s")
        args.append(tenant_id)
    if status:
        where.append("status = %s")
        args.append(status)
    return await page_of(store, table, where, args, "created_at DESC, id", page, per_page)


async def ping(store: EventStore) -> None:
    """One round trip to the database; raises `StoreUnavailable` when it cannot be made."""
    await rows(store, "SELECT 1 AS ok")
