"""The serving suite: what the router adds. The same requests go straight to one replica and
through `/serve/{task}/…` of the gateway to that replica, in the same run.

The replica is bench/upstream.py (a fixed answer, no work), the gateway runs as
`heteroflow service api-gateway` in its own process (bench/gateway_load.py starts it), and
the target is a running inference task written into the suite's database with the replica's
address, as an agent's report would leave it. Each side gets a warm-up, then a closed loop of
`--serving-requests` requests over `--serving-connections` keep-alive connections (the
client is bench/httpload.py). Added latency = router percentile − direct percentile.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from libs import auth
from libs.domain.group.serving import ServingSpec
from libs.domain.reasons import ReasonCode
from libs.domain.task import decide as commands
from libs.domain.task.events import TaskStatusChanged
from libs.domain.task.model import Task, TaskSpec, TaskType, TenantId
from libs.domain.task.states import Actor, TaskStatus
from libs.store.eventstore import EventStore

from . import Context
from .gateway_load import GatewayLoad, _free_port, _start, _stop, _wait_ready, percentile
from .httpload import Connection, HttpError, build_request
from .report import Row, against

DESCRIPTION = "router overhead: requests through /serve/ vs. directly to one replica"
TENANT = "bench-serving"
WARMUP = 200
S = TaskStatus


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("serving")
    group.add_argument("--serving-requests", type=int, default=3000, help="requests per side")
    group.add_argument(
        "--serving-connections", type=int, default=8, help="keep-alive connections per side"
    )


@dataclass
class Side:
    name: str
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0
    cpu_s: float = 0.0  # the gateway's user + system CPU over the loop (router side)

    def rate(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        return percentile(sorted(self.latencies), q) * 1000


async def closed_loop(name: str, port: int, path: str, key: str, n: int, conns: int) -> Side:
    side = Side(name)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    raw = build_request("GET", f"127.0.0.1:{port}", path, headers, None)
    pool = [Connection("127.0.0.1", port, 10.0) for _ in range(conns)]
    left = n

    async def worker(conn: Connection) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            t0 = time.perf_counter()
            try:
                status, _ = await conn.request(raw)
            except HttpError:
                side.errors += 1
                continue
            if status == 200:
                side.latencies.append(time.perf_counter() - t0)
            else:
                side.errors += 1

    started = time.perf_counter()
    try:
        await asyncio.gather(*(worker(c) for c in pool))
    finally:
        side.seconds = time.perf_counter() - started
        for c in pool:
            await c.close()
    return side


async def seed_replica(url: str, upstream_port: int) -> tuple[str, str]:
    """The bench tenant, its API key and a running inference task served at `upstream_port`."""
    store = await EventStore.open(url, max_size=4)
    try:
        await auth.create_tenant(store, TENANT, "bench")
        _, key = await auth.issue_api_key(store, TENANT, "bench")
        return key, await _target(store, upstream_port)
    finally:
        await store.close()


async def _target(store: EventStore, upstream_port: int) -> str:
    spec = TaskSpec(
        name="bench-replica",
        image="bench/upstream",
        task_type=TaskType.INFERENCE,
        serving=ServingSpec(port=upstream_port, health_path="/health"),
    )
    task = await store.create_task(TenantId(TENANT), spec)
    steps: list[tuple[TaskStatus, Actor, dict[str, Any]]] = [
        (S.SCHEDULED, Actor.SCHEDULER, {"node_id": "bench-node"}),
        (S.STARTING, Actor.AGENT, {}),
        (S.RUNNING, Actor.AGENT, {"serve_address": f"127.0.0.1:{upstream_port}"}),
    ]
    for to, actor, fields in steps:
        await store.execute(task.id, _step(to, actor, fields))
    return task.id


def _step(to: TaskStatus, actor: Actor, fields: dict[str, Any]) -> commands.Decide:
    def decide(t: Task) -> list[TaskStatusChanged]:
        return commands.decide_transition(
            t, to, actor=actor, reason_code=ReasonCode.REPORTED, **fields
        )

    return decide


async def run(ctx: Context) -> list[Row]:
    n, conns = ctx.args.serving_requests, ctx.args.serving_connections
    up_port, gw_port, probe = _free_port(), _free_port(), _free_port()
    upstream = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.upstream", str(up_port)
    )
    try:
        with ctx.database() as url, tempfile.TemporaryDirectory(prefix="hf-bench-sv-") as home:
            key, task_id = await seed_replica(url, up_port)
            load = GatewayLoad(url, ctx.servers.nats_url, key, 0.0, 0.0, conns, 1)
            gateway = await _start(load, gw_port, probe, home)
            try:
                await _wait_ready(probe, gateway)
                routed_path = f"/serve/{task_id}/v1/completions"
                await closed_loop("warm", up_port, "/v1/completions", "", WARMUP, conns)
                await closed_loop("warm", gw_port, routed_path, key, WARMUP, conns)
                direct = await closed_loop("direct", up_port, "/v1/completions", "", n, conns)
                cpu = psutil.Process(gateway.pid)
                before = sum(cpu.cpu_times()[:2])
                routed = await closed_loop("router", gw_port, routed_path, key, n, conns)
                routed.cpu_s = sum(cpu.cpu_times()[:2]) - before
            finally:
                await _stop(gateway)
    finally:
        with contextlib.suppress(ProcessLookupError):
            upstream.terminate()
        await upstream.wait()
    return rows(direct, routed, conns)


def rows(direct: Side, routed: Side, conns: int) -> list[Row]:
    note = (
        f"{conns} connections, closed loop; errors direct {direct.errors}, router {routed.errors}"
    )
    base = Row("serving.direct.rate", direct.rate(), "req/s", note=note)
    out = [base, against("serving.router.rate", routed.rate(), "req/s", base, note)]
    answered = len(routed.latencies) + routed.errors
    out.append(
        Row(
            "serving.router.gateway_cpu_per_request",
            routed.cpu_s / answered * 1000 if answered else float("nan"),
            "ms",
            note="the gateway process's CPU time / requests routed: independent of load",
        )
    )
    for q in (50, 99):
        d, r = direct.pct(q), routed.pct(q)
        out += [
            Row(f"serving.direct.latency_p{q}", d, "ms"),
            Row(f"serving.router.latency_p{q}", r, "ms"),
            Row(f"serving.router.added_latency_p{q}", r - d, "ms", note="router − direct"),
        ]
    return out
