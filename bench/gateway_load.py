"""The foundation suite's gateway part: create-task capacity and latency under load.

The gateway runs as `heteroflow service api-gateway` runs it (its own process, uvloop,
httptools, HETEROFLOW_GATEWAY_WORKERS processes) against the suite's database and the run's
NATS. First a closed loop (each connection sends its next create as soon as the last
answered: capacity, and warm-up), then an open loop at a fixed rate: each request has its
own scheduled send time and its latency is counted from that time, so a stalled server
cannot hide its queue by slowing the sender down (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from .floors import sustained
from .httpload import Connection, HttpError, build_request
from .report import Row, against, target

CREATE_BODY = {"name": "bench", "image": "busybox:latest", "command": "true"}
REQUEST_TIMEOUT_S = 10.0
READY_TIMEOUT_S = 60.0
CLOSED_LOOP_S = 3.0
NAN = float("nan")
# The targets for the gateway (docs/benchmarks.md).
TARGET_CLOSED_LOOP = 800.0  # creates/s
TARGET_P99_MS = 50.0  # at an offered 200/s


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
        p99 = percentile(lat, 99) * ms
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
            Row("gateway.create_task.latency_p99", p99, "ms"),
            target("gateway.create_task.latency_p99", p99, TARGET_P99_MS, "ms", True),
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
    """POST /api/v1/tasks with a tenant key over at most `connections` keep-alive
    connections, each lent to one request at a time from a FIFO queue; counts what did not
    come back 201. The client is bench/httpload.py: cheap enough per request that the
    generator leaves the cores to the server."""

    def __init__(self, port: int, api_key: str, connections: int) -> None:
        self.conns = [Connection("127.0.0.1", port, REQUEST_TIMEOUT_S) for _ in range(connections)]
        self.idle: asyncio.Queue[Connection] = asyncio.Queue()
        for conn in self.conns:
            self.idle.put_nowait(conn)
        self.raw = build_request(
            "POST",
            f"127.0.0.1:{port}",
            "/api/v1/tasks",
            {"Authorization": f"Bearer {api_key}"},
            CREATE_BODY,
        )

    async def aclose(self) -> None:
        for conn in self.conns:
            await conn.close()

    async def __call__(self, errors: Counter[str]) -> bool:
        conn = await self.idle.get()
        try:
            status, _ = await conn.request(self.raw)
        except HttpError as exc:
            errors[str(exc)] += 1
            return False
        finally:
            self.idle.put_nowait(conn)
        if status != 201:
            errors[f"status {status}"] += 1
        return status == 201


async def closed_loop(create: Creator, workers: int, seconds: float) -> list[Row]:
    """Capacity: `workers` connections each sending the next request when the last returns."""
    errors: Counter[str] = Counter()

    async def step(_: int) -> None:
        await create(errors)

    got = await sustained([step] * workers, 10**9, seconds)
    ok = got.done - sum(errors.values())
    note = f"{ok} answered 201 in {got.seconds:.1f} s" + (
        f"; errors {dict(errors)}" if errors else ""
    )
    metric = f"gateway.create_task.closed_loop_x{workers}"
    rate = ok / got.seconds
    return [
        Row(metric, rate, "req/s", note=note),
        target(metric, rate, TARGET_CLOSED_LOOP, "req/s"),
    ]


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


@dataclass(frozen=True)
class GatewayLoad:
    database_url: str
    nats_url: str
    api_key: str
    rate: float
    duration: float
    connections: int
    workers: int
    env: dict[str, str] = field(default_factory=dict)  # more settings for the gateway


async def gateway_load(load: GatewayLoad) -> list[Row]:
    """Closed-loop capacity first (it also warms the server up), then the open-loop run.

    At most `connections` requests are in flight, as a caller's connection pool allows; the
    others wait in the generator, and that wait counts in their latency.
    """
    port, probe = _free_port(), _free_port()
    with tempfile.TemporaryDirectory(prefix="hf-bench-gw-") as home:
        proc = await _start(load, port, probe, home)
        create = Creator(port, load.api_key, load.connections)
        try:
            await _wait_ready(probe, proc)
            capacity = await closed_loop(create, load.connections, CLOSED_LOOP_S)
            result = await open_loop(create, load.rate, load.duration)
            workers = Row("gateway.workers", load.workers, "processes")
            return [workers, *capacity, *result.rows()]
        finally:
            # Stop the server before closing the connections: abandoned requests then fail
            # at once instead of holding the close up.
            await _stop(proc)
            await create.aclose()


async def _start(load: GatewayLoad, port: int, probe: int, home: str) -> asyncio.subprocess.Process:
    env = (
        os.environ
        | {
            "HETEROFLOW_HOME": home,
            "HETEROFLOW_DATABASE_URL": load.database_url,
            "HETEROFLOW_NATS_URL": load.nats_url,
            "HETEROFLOW_HOST": "127.0.0.1",
            "HETEROFLOW_PORT": str(port),
            "HETEROFLOW_GATEWAY_WORKERS": str(load.workers),
            "HETEROFLOW_METRICS_PORT": str(probe),  # its /readyz: every worker serving
            # Failed requests come back to the load generator as statuses and are counted there.
            "HETEROFLOW_LOG_LEVEL": "critical",
        }
        | load.env
    )
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "heteroflow.cli", "service", "api-gateway", env=env
    )


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def _wait_ready(probe: int, proc: asyncio.subprocess.Process) -> None:
    conn = Connection("127.0.0.1", probe, 2.0)
    raw = build_request("GET", f"127.0.0.1:{probe}", "/readyz", {}, None)
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                raise RuntimeError(f"gateway exited early with code {proc.returncode}")
            with contextlib.suppress(HttpError):
                if (await conn.request(raw))[0] == 200:
                    return
            await asyncio.sleep(0.1)
    finally:
        await conn.close()
    raise RuntimeError(f"gateway not ready within {READY_TIMEOUT_S:g}s")
