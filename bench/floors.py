"""Floors: what the raw servers do on this machine, measured in the same run as a suite.

A platform number means little alone; next to "PostgreSQL commits N rows a second here" it
says how much of the server the platform's own code leaves on the table. Each floor is the
simplest client doing the same durable work: the same async driver, a payload the size of a
stored event, nothing else. Tables and streams are throwaway and dropped afterwards.

* PostgreSQL, one row per commit: autocommit INSERT of one jsonb row, awaited each time
  (one connection; and eight connections at once, the floor for concurrent appends).
* PostgreSQL, batched: one `executemany` of all rows in one transaction.
* JetStream, awaited: publish, wait for the ack, publish the next.
* JetStream, pipelined: publish without waiting, then wait for every ack.

Every timed loop stops at its N or after `MAX_SECONDS`, whichever comes first, and says so in
its note: on a loaded machine a run stays short and the rate stays a rate.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import nats
from nats.js import JetStreamContext
from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from .report import Row

PG_ROW_PER_COMMIT_N = 3_000
PG_BATCHED_N = 50_000
JS_AWAITED_N = 3_000
JS_PIPELINED_N = 30_000
CONCURRENCY = 8
WARMUP_N = 100
# Each timed loop stops here even if it has not reached its N (a loaded machine).
MAX_SECONDS = 5.0
# Fallback for clients without `publish_async`: publishes in flight at once.
PUBLISH_WINDOW = 500

# About the size and shape of a stored status-change event (~340 bytes of JSON).
PAYLOAD: dict[str, Any] = {
    "task_id": "task-0123456789abcdef0123",
    "from_status": "pending",
    "to_status": "scheduled",
    "actor": "scheduler",
    "reason": "placed",
    "node_id": "node-a1",
    "gpu_ids": ["GPU-00000000-0000-0000-0000-000000000000"],
    "qos": "guaranteed",
    "container_id": None,
    "exit_code": None,
    "retry_count": 0,
    "memory_mb": 2048,
    "clear_placement": False,
}
PAYLOAD_BYTES = json.dumps(PAYLOAD).encode()


@dataclass(frozen=True)
class Throughput:
    """`done` operations in `seconds`; `done < wanted` when the time cap stopped the run."""

    done: int
    seconds: float
    wanted: int

    @property
    def rate(self) -> float:
        return self.done / self.seconds if self.seconds else 0.0

    def note(self, extra: str = "") -> str:
        capped = f" of {self.wanted} (time cap)" if self.done < self.wanted else ""
        return f"n={self.done}{capped}" + (f", {extra}" if extra else "")


Step = Callable[[int], Awaitable[None]]


async def sustained(steps: Sequence[Step], n: int, max_seconds: float) -> Throughput:
    """Run operations 0..n-1, one worker per step function, until done or out of time.

    Workers take the next operation index from a shared counter, so `n` operations are spread
    over them; the cap keeps a run on a loaded machine from taking minutes.
    """
    tickets = itertools.count()
    done = 0
    start = time.perf_counter()
    deadline = start + max_seconds

    async def worker(step: Step) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            i = next(tickets)
            if i >= n:
                return
            await step(i)
            done += 1

    await asyncio.gather(*(worker(s) for s in steps))
    return Throughput(done, time.perf_counter() - start, n)


@dataclass(frozen=True)
class Floors:
    pg_row_per_commit: Row
    pg_row_per_commit_concurrent: Row
    pg_batched: Row
    js_awaited: Row
    js_pipelined: Row

    def rows(self) -> list[Row]:
        return [
            self.pg_row_per_commit,
            self.pg_row_per_commit_concurrent,
            self.pg_batched,
            self.js_awaited,
            self.js_pipelined,
        ]


# --- PostgreSQL --------------------------------------------------------------------------


async def _with_table(url: str, body: Callable[[str], Awaitable[Throughput]]) -> Throughput:
    table = "bench_floor_" + uuid.uuid4().hex[:8]
    async with await AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            f"CREATE TABLE {table} (id bigserial PRIMARY KEY, payload jsonb NOT NULL)"
        )
        try:
            return await body(table)
        finally:
            await conn.execute(f"DROP TABLE {table}")


async def pg_row_per_commit(
    url: str, n: int = PG_ROW_PER_COMMIT_N, connections: int = 1
) -> Throughput:
    """One autocommit INSERT at a time on each of `connections` connections."""

    async def body(table: str) -> Throughput:
        sql = f"INSERT INTO {table} (payload) VALUES (%s)"
        async with AsyncExitStack() as stack:
            conns = [
                await stack.enter_async_context(await AsyncConnection.connect(url, autocommit=True))
                for _ in range(connections)
            ]
            for conn in conns:
                for _ in range(WARMUP_N // connections):
                    await conn.execute(sql, (Jsonb(PAYLOAD),))

            def step(conn: AsyncConnection[Any]) -> Step:
                async def insert(_: int) -> None:
                    await conn.execute(sql, (Jsonb(PAYLOAD),))

                return insert

            return await sustained([step(c) for c in conns], n, MAX_SECONDS)

    return await _with_table(url, body)


async def pg_batched(url: str, n: int = PG_BATCHED_N) -> Throughput:
    """All rows in one `executemany` inside one transaction (no time cap: one statement)."""

    async def body(table: str) -> Throughput:
        sql = f"INSERT INTO {table} (payload) VALUES (%s)"
        async with await AsyncConnection.connect(url) as conn:
            rows = [(Jsonb(PAYLOAD),) for _ in range(n)]
            start = time.perf_counter()
            async with conn.transaction(), conn.cursor() as cur:
                await cur.executemany(sql, rows)
            return Throughput(n, time.perf_counter() - start, n)

    return await _with_table(url, body)


# --- JetStream ---------------------------------------------------------------------------


async def _with_stream(
    url: str, body: Callable[[JetStreamContext, str], Awaitable[Throughput]]
) -> Throughput:
    name = "BENCH_FLOOR_" + uuid.uuid4().hex[:8].upper()
    subject = f"bench.floor.{name.lower()}"
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(name=name, subjects=[subject])
        try:
            for _ in range(WARMUP_N):
                await js.publish(subject, PAYLOAD_BYTES)
            return await body(js, subject)
        finally:
            await js.delete_stream(name)
    finally:
        await nc.close()


async def js_awaited(url: str, n: int = JS_AWAITED_N) -> Throughput:
    """Each publish's ack awaited before the next publish."""

    async def body(js: JetStreamContext, subject: str) -> Throughput:
        async def publish(_: int) -> None:
            await js.publish(subject, PAYLOAD_BYTES)

        return await sustained([publish], n, MAX_SECONDS)

    return await _with_stream(url, body)


async def js_pipelined(url: str, n: int = JS_PIPELINED_N) -> Throughput:
    """Publishes pipelined; every ack awaited (and checked) before the clock stops."""

    async def body(js: JetStreamContext, subject: str) -> Throughput:
        start = time.perf_counter()
        deadline = start + MAX_SECONDS
        sent = 0
        if hasattr(js, "publish_async"):
            # publish_async applies back-pressure itself (at most 4000 acks pending).
            futures = []
            while sent < n and time.perf_counter() < deadline:
                futures.append(await js.publish_async(subject, PAYLOAD_BYTES))
                sent += 1
            await asyncio.gather(*futures)
        else:
            while sent < n and time.perf_counter() < deadline:
                size = min(PUBLISH_WINDOW, n - sent)
                await asyncio.gather(*(js.publish(subject, PAYLOAD_BYTES) for _ in range(size)))
                sent += size
        return Throughput(sent, time.perf_counter() - start, n)

    return await _with_stream(url, body)


async def measure(database_url: str, nats_url: str) -> Floors:
    """All floors, one after the other (nothing else of ours runs meanwhile)."""
    one = await pg_row_per_commit(database_url)
    many = await pg_row_per_commit(database_url, connections=CONCURRENCY)
    batched = await pg_batched(database_url)
    awaited = await js_awaited(nats_url)
    pipelined = await js_pipelined(nats_url)
    return Floors(
        Row("floor.pg.insert_row_per_commit", one.rate, "rows/s", note=one.note()),
        Row(
            f"floor.pg.insert_row_per_commit_x{CONCURRENCY}",
            many.rate,
            "rows/s",
            note=many.note(f"{CONCURRENCY} connections"),
        ),
        Row("floor.pg.insert_batched_executemany", batched.rate, "rows/s", note=batched.note()),
        Row("floor.js.publish_awaited", awaited.rate, "msg/s", note=awaited.note()),
        Row("floor.js.publish_pipelined", pipelined.rate, "msg/s", note=pipelined.note()),
    )
