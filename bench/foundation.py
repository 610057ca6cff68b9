"""The foundation suite: the event store's append paths and the gateway's create-task latency.

* CAS appends: one status change per transaction through `EventStore.execute` (load under
  `FOR UPDATE`, decide, append, project, commit), sequentially and from eight workers on
  distinct tasks. Compared with one-row-per-commit INSERTs on as many connections.
* Batched appends: `create_tasks` with 500 items per transaction, compared with one
  `executemany` in one transaction.
* Gateway: the real app under uvicorn in a child process (so the load generator does not share
  its event loop). First a short closed loop of eight clients (capacity, and warm-up), then an
  open loop at a fixed rate: each request has its own scheduled send time and its latency is
  counted from that time, so a stalled server cannot hide its queue by slowing the sender down
  (no coordinated omission).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import ssl
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import httpx

from libs import auth
from libs.domain.commands import decide_transition
from libs.domain.reasons import ReasonCode
from libs.domain.states import Actor, TaskStatus
from libs.domain.task import TaskId, TaskSpec, TenantId
from libs.store.eventstore import EventStore

from . import Context
from .floors import CONCURRENCY, Throughput, sustained
from .report import Row, against

DESCRIPTION = "event store appends (CAS, batched) and gateway create-task latency"

CAS_N = 2_000
BATCHED_N = 10_000
BATCH_SIZE = 500
TENANT = TenantId("bench")
SPEC = TaskSpec(name="bench", image="busybox:latest", command="true")
CREATE_BODY = {"name": "bench", "image": "busybox:latest", "command": "true"}
REQUEST_TIMEOUT_S = 10.0
READY_TIMEOUT_S = 30.0
MAX_CONNECTIONS = 32
NAN = float("nan")
# Time caps so a loaded machine cannot stretch the suite to minutes.
STORE_MAX_SECONDS = 10.0
CLOSED_LOOP_S = 3.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("foundation")
    group.add_argument(
        "--rate", type=float, default=200.0, help="gateway requests per second (default 200)"
    )
    group.add_argument(
        "--duration", type=float, default=10.0, help="gateway measured seconds (default 10)"
    )
    group.add_argument(
        "--connections",
        type=int,
        default=MAX_CONNECTIONS,
        help=f"gateway client connections at most (default {MAX_CONNECTIONS})",
    )


async def run(ctx: Context) -> list[Row]:
    floors = ctx.floors
    with ctx.database() as url:
        store = await EventStore.open(url, max_size=CONCURRENCY + 2)
        try:
            await auth.create_tenant(store, TENANT, "bench")
            _, api_key = await auth.issue_api_key(store, TENANT, "bench")
            batched, ids = await batched_appends(store, BATCHED_N, BATCH_SIZE)
            # The batched run leaves pending tasks; each CAS run moves its own share once.
            if len(ids) < 2 * CAS_N:
                ids += await _create(store, 2 * CAS_N - len(ids))
            sequential = await cas_appends(store, ids[:CAS_N], concurrency=1)
            concurrent = await cas_appends(store, ids[CAS_N : 2 * CAS_N], concurrency=CONCURRENCY)
        finally:
            await store.close()
        gateway = await gateway_load(
            url, api_key, ctx.args.rate, ctx.args.duration, ctx.args.connections
        )
    return [
        against(
            "store.cas_append.sequential",
            sequential.rate,
            "events/s",
            floors.pg_row_per_commit,
            sequential.note(),
        ),
        against(
            f"store.cas_append.concurrent_{CONCURRENCY}",
            concurrent.rate,
            "events/s",
            floors.pg_row_per_commit_concurrent,
            concurrent.note(f"{CONCURRENCY} workers on distinct tasks"),
        ),
        against(
            f"store.batched_append.batch_{BATCH_SIZE}",
            batched.rate,
            "events/s",
            floors.pg_batched,
            batched.note(),
        ),
        *gateway,
    ]


# --- event store -------------------------------------------------------------------------


async def _create(store: EventStore, n: int) -> list[TaskId]:
    ids: list[TaskId] = []
    for start in range(0, n, BATCH_SIZE):
        items = [(TENANT, SPEC, None, None)] * min(BATCH_SIZE, n - start)
        ids.extend(t.id for t in await store.create_tasks(items))
    return ids


async def batched_appends(store: EventStore, n: int, batch: int) -> tuple[Throughput, list[TaskId]]:
    """`create_tasks` in transactions of `batch` items (one event each); the new task ids."""
    ids: list[TaskId] = []
    start = time.perf_counter()
    deadline = start + STORE_MAX_SECONDS
    while len(ids) < n and time.perf_counter() < deadline:
        items = [(TENANT, SPEC, None, None)] * min(batch, n - len(ids))
        ids.extend(t.id for t in await store.create_tasks(items))
    return Throughput(len(ids), time.perf_counter() - start, n), ids


async def cas_appends(store: EventStore, ids: Sequence[TaskId], *, concurrency: int) -> Throughput:
    """`pending -> scheduled` on each task, CAS on the expected status, `concurrency` workers."""
    decide = partial(
        decide_transition,
        to=TaskStatus.SCHEDULED,
        actor=Actor.SCHEDULER,
        expected_status=TaskStatus.PENDING,
        reason_code=ReasonCode.PLACED,
        node_id="node-bench",
    )

    async def move(i: int) -> None:
        # Workers take distinct indexes, so each task moves once and no CAS misses.
        await store.execute(ids[i], decide)

    return await sustained([move] * concurrency, len(ids), STORE_MAX_SECONDS)


# --- gateway -----------------------------------------------------------------------------


def _serve_gateway(database_url: str, port: int) -> None:
    """Child-process entry: the gateway app under uvicorn until SIGTERM."""
    import uvicorn
    from pydantic import SecretStr

    from libs.config import GatewaySettings
    from libs.logging import configure
    from services.api_gateway.app import create_app

    # Failed requests come back to the load generator as statuses and are counted there;
    # abandoned ones at the end of a run would otherwise print a traceback each.
    configure("critical", "json")
    settings = GatewaySettings(
        database_url=SecretStr(database_url), host="127.0.0.1", port=port, log_level="critical"
    )
    uvicorn.run(
        create_app(settings),
        host="127.0.0.1",
        port=port,
        log_config=None,
        log_level="critical",
        access_log=False,
        timeout_graceful_shutdown=2,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (NaN when empty)."""
    if not sorted_values:
        return NAN
    rank = max(1, min(len(sorted_values), round(q / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


@dataclass
class LoadResult:
    rate: float
    duration: float
    sent: int = 0
    latencies: list[float] = field(default_factory=list)  # seconds, successful requests
    lags: list[float] = field(default_factory=list)  # seconds the sender was late
    errors: Counter[str] = field(default_factory=Counter)
    elapsed: float = 0.0

    def rows(self) -> list[Row]:
        lat = sorted(self.latencies)
        ms = 1000.0
        offered = Row("gateway.create_task.offered_rate", self.rate, "req/s")
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(self.errors.items()))
        return [
            offered,
            against(
                "gateway.create_task.achieved_rate",
                len(lat) / self.elapsed if self.elapsed else 0.0,
                "req/s",
                offered,
                f"{len(lat)} of {self.sent} sent in {self.duration:g} s answered 201",
            ),
            Row("gateway.create_task.latency_p50", percentile(lat, 50) * ms, "ms"),
            Row("gateway.create_task.latency_p90", percentile(lat, 90) * ms, "ms"),
            Row("gateway.create_task.latency_p99", percentile(lat, 99) * ms, "ms"),
            Row("gateway.create_task.latency_max", (lat[-1] if lat else NAN) * ms, "ms"),
            Row("gateway.create_task.errors", sum(self.errors.values()), "count", note=errors),
            Row(
                "gateway.client.send_lag_p99",
                percentile(sorted(self.lags), 99) * ms,
                "ms",
                note="how late the load generator sent; large means the client was starved",
            ),
        ]


class Creator:
    """POST /api/v1/tasks with a tenant key over at most `connections` connections; counts
    what did not come back 201.

    Each connection is an httpx client of its own, lent to one request at a time from a FIFO
    queue. One client with a large pool would be simpler, but httpx's pool walks all its
    connections and queued requests on every change, so its cost per request grows with the
    pool: with 32-64 connections the load generator took more CPU than the gateway, on the same
    two cores, and the gateway seemed to slow down as concurrency rose. Timeouts are httpx's
    own (connect, write, read): cancelling an httpx request from outside is not reliably
    prompt, so the open loop bounds its run with a deadline instead.
    """

    def __init__(self, base_url: str, api_key: str, connections: int) -> None:
        tls = ssl.create_default_context()  # unused over http; shared, as building one is slow
        self.clients = [
            httpx.AsyncClient(
                base_url=base_url,
                limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
                timeout=REQUEST_TIMEOUT_S,
                verify=tls,
            )
            for _ in range(connections)
        ]
        self.idle: asyncio.Queue[httpx.AsyncClient] = asyncio.Queue()
        for client in self.clients:
            self.idle.put_nowait(client)
        self.headers = {"Authorization": f"Bearer {api_key}"}

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()

    async def __call__(self, errors: Counter[str]) -> bool:
        client = await self.idle.get()
        try:
            r = await client.post("/api/v1/tasks", json=CREATE_BODY, headers=self.headers)
        except httpx.HTTPError as exc:
            errors[type(exc).__name__] += 1
            return False
        finally:
            self.idle.put_nowait(client)
        if r.status_code != 201:
            errors[f"status {r.status_code}"] += 1
        return r.status_code == 201


async def closed_loop(create: Creator, workers: int, seconds: float) -> Row:
    """Capacity: `workers` clients each sending the next request when the last returns."""
    errors: Counter[str] = Counter()

    async def step(_: int) -> None:
        await create(errors)

    got = await sustained([step] * workers, 10**9, seconds)
    ok = got.done - sum(errors.values())
    note = f"{ok} answered 201 in {got.seconds:.1f} s" + (
        f"; errors {dict(errors)}" if errors else ""
    )
    return Row(f"gateway.create_task.closed_loop_x{workers}", ok / got.seconds, "req/s", note=note)


async def open_loop(create: Creator, rate: float, duration: float) -> LoadResult:
    """Send `rate * duration` creates, request i at t0 + i / rate, whatever came back.

    What has no answer `REQUEST_TIMEOUT_S` after the last send is counted as an error and
    abandoned, so an overloaded server ends the run on time instead of stretching it.
    """
    loop = asyncio.get_running_loop()
    result = LoadResult(rate, duration, sent=int(rate * duration))
    t0 = loop.time() + 0.01
    closed = False

    async def one(scheduled: float) -> None:
        result.lags.append(loop.time() - scheduled)
        errors: Counter[str] = Counter()
        ok = await create(errors)
        if closed:
            return
        result.errors.update(errors)
        if ok:
            result.latencies.append(loop.time() - scheduled)

    pending = []
    for i in range(result.sent):
        scheduled = t0 + i / rate
        delay = scheduled - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        pending.append(asyncio.create_task(one(scheduled)))
    deadline = t0 + duration + REQUEST_TIMEOUT_S
    _, late = await asyncio.wait(pending, timeout=max(0.0, deadline - loop.time()))
    closed = True
    # Never shorter than the run: answers that all came on time give the offered rate.
    result.elapsed = max(duration, loop.time() - t0)
    if late:
        result.errors[f"no answer within {REQUEST_TIMEOUT_S:g} s of the last send"] += len(late)
        for task in late:
            task.cancel()
        await asyncio.wait(late, timeout=2.0)
    return result


async def gateway_load(
    database_url: str, api_key: str, rate: float, duration: float, connections: int
) -> list[Row]:
    """Closed-loop capacity first (it also warms the server up), then the open-loop run.

    At most `connections` requests are in flight, as a caller's connection pool allows; the
    others wait in the generator, and that wait counts in their latency.
    """
    port = _free_port()
    proc = multiprocessing.get_context("spawn").Process(
        target=_serve_gateway, args=(database_url, port), daemon=True
    )
    proc.start()
    create = Creator(f"http://127.0.0.1:{port}", api_key, connections)
    try:
        await _wait_ready(create.clients[0], proc)
        capacity = await closed_loop(create, CONCURRENCY, CLOSED_LOOP_S)
        load = await open_loop(create, rate, duration)
        return [capacity, *load.rows()]
    finally:
        # Stop the server before closing the clients: abandoned requests then fail at once
        # instead of holding the close up.
        await _stop(proc)
        await create.aclose()


async def _stop(proc: multiprocessing.process.BaseProcess) -> None:
    if proc.is_alive():
        proc.terminate()
        await asyncio.to_thread(proc.join, 10)
    if proc.is_alive():
        proc.kill()
        await asyncio.to_thread(proc.join)


async def _wait_ready(client: httpx.AsyncClient, proc: multiprocessing.process.BaseProcess) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if not proc.is_alive():
            raise RuntimeError(f"gateway exited early with code {proc.exitcode}")
        try:
            if (await client.get("/readyz")).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"gateway not ready within {READY_TIMEOUT_S:g}s")
