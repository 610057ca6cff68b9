"""The scheduler suite's end-to-end part: submit-to-running at a steady rate, then node loss.

The control plane runs in this process, each piece with its own NATS connection: the outbox
relay and the scheduler service as deployed (`services.scheduler.service.run`: placement,
dispatch, reports, node monitor, group controller, under their leases). The nodes are a
simulated fleet (agent/simulated_fleet.py) in a child process, as nodes are other machines:
it registers, heartbeats, takes commands and reports, and runs nothing. Tasks are created in
the store at fixed times (an open loop, as the gateway would); every time below is read back
from the events table afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypeVar

import nats.errors
from nats.aio.client import Client

from agent import simulated_fleet
from agent.simulated_fleet import fleet_inventories
from libs.bus.nats import connect, ensure_streams
from libs.domain.task.model import TaskId, TaskSpec, TenantId
from libs.service import ServiceContext
from libs.store.eventstore import EventStore
from libs.store.pool import rows as query
from libs.store.relay import OutboxRelay
from services.scheduler import service as scheduler_service

NAN = float("nan")
SETTLE_TIMEOUT_S = 30.0
# Every time the suite reports is read back from the events table; polling only decides when a
# wait ends, and each poll (a count over thousands of ids) takes CPU from the control plane
# running in this process: 0.05 s cost 6 % of it at 250 tasks/s.
POLL_S = 0.2
STOP_TIMEOUT_S = 15.0


@dataclass
class SteadyResult:
    rate: float
    duration: float
    submitted: list[TaskId] = field(default_factory=list)
    submit_seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)  # seconds, tasks that reached running
    # Seconds per hop, ascending: created -> scheduled (placement), scheduled -> starting
    # (relay, dispatch, command, the node's report), starting -> running (the next report).
    hops: dict[str, list[float]] = field(default_factory=dict)
    send_lag_max: float = 0.0


@dataclass
class LossResult:
    threshold: float
    node_id: str = ""
    tasks: int = 0
    to_offline: float = NAN  # silence -> node_offline event
    to_pending: float = NAN  # node_offline -> the last of its tasks back in pending
    to_running: float = NAN  # node_offline -> the last of them running elsewhere
    false_offline: int = 0  # other nodes declared offline during the whole run


@dataclass
class PathResult:
    nodes: int
    replicas: int
    steady: SteadyResult
    loss: LossResult
    register_seconds: float = 0.0


async def run_path(
    database_url: str,
    nats_url: str,
    *,
    nodes: int,
    rate: float,
    duration: float,
    offline_after: float,
    spec: TaskSpec,
    tenant: TenantId,
    replicas: int = 1,
    then: After | None = None,
) -> PathResult:
    """The steady run, then the node-loss run, then `then` (the rate search) if given, on the
    same control plane and fleet."""
    store = await EventStore.open(database_url, max_size=10)
    stop = asyncio.Event()
    conns = [await connect(nats_url, f"bench-{name}") for name in ("scheduler", "relay")]
    fleet = FleetProcess(nats_url, nodes)
    try:
        sched_nc, relay_nc = conns
        js = sched_nc.jetstream()
        await ensure_streams(js)
        jobs = [asyncio.create_task(OutboxRelay(database_url, relay_nc.jetstream()).run(stop))]
        for _ in range(replicas):
            # Replicas compete for the same durable consumers (dispatch, reports); one holds
            # each lease (placement, node monitor, groups).
            settings = scheduler_service.SchedulerSettings(
                node_offline_after_s=offline_after, instance_id=uuid.uuid4().hex[:8]
            )
            service = ServiceContext(store, sched_nc, js, "scheduler")
            jobs.append(asyncio.create_task(scheduler_service.run(service, stop, settings)))
        try:
            started = time.perf_counter()
            await fleet.start(sched_nc)
            await fleet.call({"op": "register"})
            await _until(_count(store, "SELECT count(*) AS n FROM nodes", nodes), SETTLE_TIMEOUT_S)
            result = PathResult(
                nodes, replicas, SteadyResult(rate, duration), LossResult(offline_after)
            )
            result.register_seconds = time.perf_counter() - started
            since = datetime.now(UTC)
            await warm_up(store, spec, tenant)
            result.steady = await steady_load(store, spec, tenant, rate, duration)
            result.loss = await node_loss(store, fleet, offline_after)
            result.loss.false_offline = await _false_offline(store, since, result.loss.node_id)
            if then is not None:
                await then(store, fleet)
            return result
        finally:
            await fleet.stop()
            stop.set()
            _, late = await asyncio.wait(jobs, timeout=STOP_TIMEOUT_S)
            for job in late:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
    finally:
        fleet.kill()
        for nc in conns:
            with contextlib.suppress(Exception):
                await nc.drain()
        await store.close()


# What runs after the node-loss run, on the same store and fleet.
After = Callable[[EventStore, "FleetProcess"], Awaitable[None]]


# --- the fleet ----------------------------------------------------------------------------


def _fleet_main(nats_url: str, nodes: int, control: str, durable: str) -> None:
    """Child-process entry: a simulated fleet until told to stop."""
    from libs.logging import configure

    configure("warning", "json")
    asyncio.run(simulated_fleet.serve(nats_url, fleet_inventories(nodes), control, durable=durable))


class FleetProcess:
    """A simulated fleet in a child process, steered over NATS request/reply."""

    def __init__(self, nats_url: str, nodes: int) -> None:
        run = uuid.uuid4().hex[:8]
        self.control = f"bench.fleet.{run}.control"
        self.proc = multiprocessing.get_context("spawn").Process(
            target=_fleet_main,
            args=(nats_url, nodes, self.control, f"bench-fleet-{run}"),
            daemon=True,
        )
        self.nc: Client | None = None

    async def start(self, nc: Client) -> None:
        """Start the child and wait until it answers on its control subject."""
        self.nc = nc
        self.proc.start()
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while True:
            try:
                await self.call({"op": "ping"}, wait_s=1.0)
                return
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                if time.monotonic() > deadline or not self.proc.is_alive():
                    raise RuntimeError("the simulated fleet did not start") from None
                await asyncio.sleep(0.1)

    async def call(self, request: dict[str, str], wait_s: float = 120.0) -> None:
        assert self.nc is not None
        await self.nc.request(self.control, json.dumps(request).encode(), timeout=wait_s)

    async def stop(self) -> None:
        if self.proc.is_alive():
            with contextlib.suppress(Exception):
                await self.call({"op": "stop"}, wait_s=5.0)
            await asyncio.to_thread(self.proc.join, STOP_TIMEOUT_S)

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


# --- load ----------------------------------------------------------------------------------


async def warm_up(store: EventStore, spec: TaskSpec, tenant: TenantId, n: int = 10) -> None:
    """A few tasks through the whole path first: leases won, consumers created, caches warm."""
    ids = [t.id for t in await store.create_tasks([(tenant, spec, None, None)] * n)]
    await _until(_running(store, ids), SETTLE_TIMEOUT_S)


async def steady_load(
    store: EventStore,
    spec: TaskSpec,
    tenant: TenantId,
    rate: float,
    duration: float,
    settle_s: float = SETTLE_TIMEOUT_S,
) -> SteadyResult:
    """Create `rate * duration` tasks, task i at t0 + i / rate, each in its own transaction;
    then wait up to `settle_s` for all of them to run."""
    result = SteadyResult(rate, duration)
    loop = asyncio.get_running_loop()
    t0 = loop.time() + 0.01
    creates: list[asyncio.Task[None]] = []

    async def create() -> None:
        task = await store.create_task(tenant, spec)
        result.submitted.append(task.id)

    for i in range(int(rate * duration)):
        scheduled = t0 + i / rate
        delay = scheduled - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        result.send_lag_max = max(result.send_lag_max, loop.time() - scheduled)
        creates.append(asyncio.create_task(create()))
    await asyncio.gather(*creates, return_exceptions=True)
    result.submit_seconds = loop.time() - t0
    with contextlib.suppress(TimeoutError):
        await _until(_running(store, result.submitted), settle_s)
    result.latencies, result.hops = await submit_to_running(store, result.submitted)
    return result


HOPS = ("placed", "started", "running")


async def submit_to_running(
    store: EventStore, ids: Sequence[str]
) -> tuple[list[float], dict[str, list[float]]]:
    """Seconds from each task's creation to its first `running` transition, as stored, and
    the seconds of each hop on the way (see SteadyResult.hops)."""
    rows = await query(
        store,
        "SELECT t.created_at,"
        " min(e.occurred_at) FILTER (WHERE e.payload->>'to_status' = 'scheduled') AS placed,"
        " min(e.occurred_at) FILTER (WHERE e.payload->>'to_status' = 'starting') AS started,"
        " min(e.occurred_at) FILTER (WHERE e.payload->>'to_status' = 'running') AS running"
        " FROM tasks t JOIN events e ON e.stream_id = t.id"
        " WHERE t.id = ANY(%s) AND e.type = 'task_status_changed'"
        " GROUP BY t.id, t.created_at",
        [list(ids)],
    )
    total = sorted((r["running"] - r["created_at"]).total_seconds() for r in rows if r["running"])
    hops: dict[str, list[float]] = {}
    for before, after in zip(("created_at", *HOPS), HOPS, strict=False):
        hops[after] = sorted(
            (r[after] - r[before]).total_seconds() for r in rows if r[after] and r[before]
        )
    return total, hops


# --- node loss -----------------------------------------------------------------------------


async def node_loss(store: EventStore, fleet: FleetProcess, threshold: float) -> LossResult:
    """Silence the node running the most tasks; time offline, requeue and restart elsewhere."""
    result = LossResult(threshold)
    rows = await query(
        store,
        "SELECT node_id, count(*) AS n FROM tasks WHERE status = 'running'"
        " GROUP BY node_id ORDER BY count(*) DESC, node_id LIMIT 1",
    )
    if not rows:
        return result
    node_id = rows[0]["node_id"]
    ids = [
        r["id"]
        for r in await query(
            store, "SELECT id FROM tasks WHERE node_id = %s AND status = 'running'", [node_id]
        )
    ]
    result.node_id, result.tasks = node_id, len(ids)
    silenced_at = datetime.now(UTC)
    await fleet.call({"op": "silence", "node_id": node_id})
    offline_at = await _until(_offline_at(store, node_id), threshold + SETTLE_TIMEOUT_S)
    result.to_offline = (offline_at - silenced_at).total_seconds()
    for status in ("pending", "running"):
        with contextlib.suppress(TimeoutError):
            await _until(_moved(store, ids, status, offline_at), SETTLE_TIMEOUT_S)
    moves = await query(store, _MOVES, [ids, offline_at])
    pending = [r["at"] for r in moves if r["status"] == "pending"]
    running = [r["at"] for r in moves if r["status"] == "running"]
    if len(pending) == len(ids):
        result.to_pending = (max(pending) - offline_at).total_seconds()
    if len(running) == len(ids):
        result.to_running = (max(running) - offline_at).total_seconds()
    return result


# Per task and status, the first move there since the node went offline.
_MOVES = (
    "SELECT stream_id, payload->>'to_status' AS status, min(occurred_at) AS at"
    " FROM events WHERE stream_id = ANY(%s) AND type = 'task_status_changed'"
    " AND occurred_at >= %s AND payload->>'to_status' IN ('pending', 'running')"
    " GROUP BY stream_id, payload->>'to_status'"
)


def _moved(store: EventStore, ids: Sequence[str], status: str, since: datetime) -> Probe[bool]:
    async def probe() -> bool | None:
        rows = await query(store, _MOVES, [list(ids), since])
        return True if sum(r["status"] == status for r in rows) >= len(ids) else None

    return probe


async def _false_offline(store: EventStore, since: datetime, lost: str) -> int:
    rows = await query(
        store,
        "SELECT count(*) AS n FROM events WHERE type = 'node_offline'"
        " AND occurred_at >= %s AND stream_id <> %s",
        [since, lost],
    )
    return int(rows[0]["n"])


# --- polling -------------------------------------------------------------------------------

T = TypeVar("T")
Probe = Callable[[], Awaitable[T | None]]


async def _until(probe: Probe[T], within_s: float) -> T:
    """Poll `probe` until it returns something other than None."""
    deadline = time.monotonic() + within_s
    while True:
        value = await probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {within_s:g} s")
        await asyncio.sleep(POLL_S)


def _count(store: EventStore, sql: str, n: int) -> Probe[bool]:
    async def probe() -> bool | None:
        rows = await query(store, sql)
        return True if int(rows[0]["n"]) >= n else None

    return probe


def none_running(store: EventStore) -> Probe[bool]:
    async def probe() -> bool | None:
        rows = await query(store, "SELECT count(*) AS n FROM tasks WHERE status = 'running'")
        return True if int(rows[0]["n"]) == 0 else None

    return probe


def _running(store: EventStore, ids: Sequence[str]) -> Probe[bool]:
    async def probe() -> bool | None:
        rows = await query(
            store,
            "SELECT count(*) AS n FROM tasks WHERE id = ANY(%s) AND status = 'running'",
            [list(ids)],
        )
        return True if int(rows[0]["n"]) >= len(ids) else None

    return probe


def _offline_at(store: EventStore, node_id: str) -> Probe[datetime]:
    async def probe() -> datetime | None:
        rows = await query(
            store,
            "SELECT min(occurred_at) AS at FROM events"
            " WHERE stream_id = %s AND type = 'node_offline'",
            [node_id],
        )
        at: datetime | None = rows[0]["at"]
        return at

    return probe
