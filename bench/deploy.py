"""The deploy suite: placements/s and submit → running p99 of the multi-container deployment
(deploy/compose.yaml: three NATS servers with R3 streams, PostgreSQL, every service in its own
container, two gateways, two schedulers, three agents) beside the single-process
`heteroflow up`, on the same machine in the same run.

Both get the same load through their gateways (round-robin over the compose file's two):
first an open loop of `--deploy-rate` creates/s for `--deploy-duration` s, each create sent at
its own scheduled time, whose tasks' created → running times are read back from the
deployment's event log; then a burst of `--deploy-burst` creates over 8 connections at once,
whose placements/s is the burst's tasks over the time from its first create to its last
`scheduled` event. The agents run the simulated runtime (a task "runs" for a second, nothing
is started), so the numbers are the control plane's; `--deploy-runtime docker` runs busybox
containers instead. Nodes offer 64 cores so capacity never holds a task back.

`up` runs as a child process with its one local agent, on the run's servers (one NATS, one
PostgreSQL: what its embedded mode starts). The deployment's images are built first
(deploy/images/build.sh, cached); without a Docker engine or the tools to build the images
its rows have no value and say why.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from libs.store.eventstore import EventStore
from libs.store.pool import rows as query

from . import Context
from .gateway_load import _free_port, _stop, percentile
from .report import Row, against
from .scheduler_path import submit_to_running

DESCRIPTION = "placements/s, submit → running p99: the multi-container deployment beside `up`"

NAN = float("nan")
CONNECTIONS = 8
SETTLE_TIMEOUT_S = 90.0
READY_TIMEOUT_S = 90.0
POLL_S = 0.2
TIMEOUT = httpx.Timeout(10.0, connect=2.0)
# Capacity never binds: the numbers are about placing, not waiting for room.
NODE_ENV = {"HETEROFLOW_NODE_CPU_CORES": "64", "HETEROFLOW_NODE_MEMORY_MB": "262144"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("deploy")
    group.add_argument(
        "--deploy-rate", type=float, default=5.0, help="creates/s of the open loop (default 5)"
    )
    group.add_argument(
        "--deploy-duration", type=float, default=20.0, help="seconds of the open loop (default 20)"
    )
    group.add_argument(
        "--deploy-burst", type=int, default=100, help="tasks of the placement burst (default 100)"
    )
    group.add_argument(
        "--deploy-runtime",
        choices=("simulated", "docker"),
        default="simulated",
        help="the agents' runtime (default simulated: nothing is started)",
    )


@dataclass
class Measured:
    latencies: list[float] = field(default_factory=list)  # s, created -> running, ascending
    submitted: int = 0
    burst: int = 0
    placed: int = 0
    burst_seconds: float = NAN  # first create -> last `scheduled`, over the burst
    create_seconds: float = NAN  # the burst's creates alone, as the client saw them
    errors: Counter[str] = field(default_factory=Counter)

    @property
    def placements_per_s(self) -> float:
        return self.placed / self.burst_seconds if self.burst_seconds > 0 else NAN


def task_body(runtime: str, i: int) -> dict[str, Any]:
    body: dict[str, Any] = {"name": f"bench-deploy-{i}", "image": "busybox:latest"}
    body |= {"cpu_cores": 0.1, "memory_mb": 64}
    if runtime == "simulated":
        return body | {"command": "true", "labels": {"sim.duration_s": "1"}}
    return body | {"command": "sleep 1"}


async def _create(client: httpx.AsyncClient, body: dict[str, Any], m: Measured) -> str:
    try:
        r = await client.post("/api/v1/tasks", json=body)
    except httpx.HTTPError as e:
        m.errors[type(e).__name__] += 1
        return ""
    if r.status_code != 201:
        m.errors[str(r.status_code)] += 1
        return ""
    return str(r.json()["id"])


async def open_loop(
    clients: Sequence[httpx.AsyncClient], rate: float, duration: float, runtime: str, m: Measured
) -> list[str]:
    """Each create at its own time (t0 + i/rate), whatever the earlier ones took."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    async def one(i: int) -> str:
        await asyncio.sleep(max(0.0, t0 + i / rate - loop.time()))
        return await _create(clients[i % len(clients)], task_body(runtime, i), m)

    ids = await asyncio.gather(*(one(i) for i in range(int(rate * duration))))
    return [i for i in ids if i]


async def burst(
    clients: Sequence[httpx.AsyncClient], n: int, runtime: str, m: Measured
) -> list[str]:
    gate = asyncio.Semaphore(CONNECTIONS)

    async def one(i: int) -> str:
        async with gate:
            return await _create(clients[i % len(clients)], task_body(runtime, 10_000 + i), m)

    ids = await asyncio.gather(*(one(i) for i in range(n)))
    return [i for i in ids if i]


_REACHED = (
    "SELECT count(DISTINCT e.stream_id) AS n FROM events e WHERE e.stream_id = ANY(%s)"
    " AND e.type = 'task_status_changed' AND e.payload->>'to_status' = %s"
)
_PLACED = (
    "SELECT min(t.created_at) AS first, max(e.occurred_at) AS last,"
    " count(DISTINCT t.id) AS placed"
    " FROM tasks t JOIN events e ON e.stream_id = t.id WHERE t.id = ANY(%s)"
    " AND e.type = 'task_status_changed' AND e.payload->>'to_status' = 'scheduled'"
)


async def _until_reached(store: EventStore, ids: list[str], status: str) -> None:
    """Until every task of `ids` went through `status`, or SETTLE_TIMEOUT_S (then measured as
    far as it got: the rows say how many)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while time.monotonic() < deadline:
        if (await query(store, _REACHED, [ids, status]))[0]["n"] >= len(ids):
            return
        await asyncio.sleep(POLL_S)


async def load(urls: Sequence[str], key: str, database_url: str, args: Any) -> Measured:
    """The open loop, then the burst, through `urls`; times read from the event log."""
    m = Measured()
    headers = {"Authorization": f"Bearer {key}"}
    clients = [httpx.AsyncClient(base_url=u, headers=headers, timeout=TIMEOUT) for u in urls]
    store = await EventStore.open(database_url, max_size=2)
    try:
        steady = await open_loop(
            clients, args.deploy_rate, args.deploy_duration, args.deploy_runtime, m
        )
        m.submitted = len(steady)
        await _until_reached(store, steady, "running")
        m.latencies, _ = await submit_to_running(store, steady)
        started = time.perf_counter()
        placing = await burst(clients, args.deploy_burst, args.deploy_runtime, m)
        m.create_seconds = time.perf_counter() - started
        m.burst = len(placing)
        await _until_reached(store, placing, "scheduled")
        (row,) = await query(store, _PLACED, [placing])
        if row["placed"]:
            m.placed = int(row["placed"])
            m.burst_seconds = (row["last"] - row["first"]).total_seconds()
    finally:
        await store.close()
        for c in clients:
            await c.aclose()
    return m


def rows(name: str, m: Measured, baseline: list[Row] | None, why: str = "") -> list[Row]:
    """Three rows; with a baseline (the `up` rows), each names its `up` twin as the floor."""
    note = why or (
        f"{m.placed} of {m.burst} placed in {m.burst_seconds:.2f} s "
        f"(their creates {m.create_seconds:.2f} s); "
        f"{len(m.latencies)} of {m.submitted} running"
        + (f"; refused: {dict(m.errors)}" if m.errors else "")
    )
    lat = [s * 1000 for s in m.latencies]
    made = [
        Row(f"deploy.{name}.placements", m.placements_per_s, "placements/s", note=note),
        Row(f"deploy.{name}.submit_to_running_p50", percentile(lat, 50), "ms"),
        Row(f"deploy.{name}.submit_to_running_p99", percentile(lat, 99), "ms"),
    ]
    if baseline is None:
        return made
    return [
        against(r.metric, r.value, r.unit, floor, r.note)
        for r, floor in zip(made, baseline, strict=True)
    ]


async def run(ctx: Context) -> list[Row]:
    args = ctx.args
    with ctx.database() as url:
        up = rows("up", await measure_up(url, ctx.servers.nats_url, args), None)
    return up + await measure_compose(args, up)


# --- the single process ---------------------------------------------------------------------


async def measure_up(database_url: str, nats_url: str, args: Any) -> Measured:
    with tempfile.TemporaryDirectory(prefix="hf-bench-up-") as tmp:
        home = Path(tmp) / "home"
        port = _free_port()
        env = os.environ | NODE_ENV
        env |= {
            "HETEROFLOW_HOME": str(home),
            "HETEROFLOW_PORT": str(port),
            "HETEROFLOW_METRICS_PORT": str(_free_port()),
            "HETEROFLOW_DATABASE_URL": database_url,
            "HETEROFLOW_NATS_URL": nats_url,
            "HETEROFLOW_RUNTIME": args.deploy_runtime,
            "HETEROFLOW_DETECT_NVIDIA": "false",
            "HETEROFLOW_DECLARED_GPUS": "nvidia:A100-80GB:81920x4",
            "HETEROFLOW_NODE_ID": "bench-up-node",
            "HETEROFLOW_LOG_LEVEL": "warning",
        }
        # Its output is dropped: the rows count what it refused, and a failed start is
        # reported with its exit code.
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "heteroflow.cli",
            "up",
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            creds = await _up_ready(url, home, proc)
            return await load([url], creds["tenant_api_key"], database_url, args)
        finally:
            await _stop(proc)


async def _up_ready(url: str, home: Path, proc: asyncio.subprocess.Process) -> dict[str, str]:
    """Credentials once the gateway is ready and the local agent's node is online."""
    path = home / "credentials.json"
    deadline = time.monotonic() + READY_TIMEOUT_S
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                raise RuntimeError(f"heteroflow up exited with code {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, OSError):
                creds: dict[str, str] = json.loads(await asyncio.to_thread(path.read_text))
                if (await client.get(f"{url}/readyz")).status_code == 200:
                    headers = {"Authorization": f"Bearer {creds['operator_token']}"}
                    r = await client.get(f"{url}/api/v1/nodes", headers=headers)
                    if any(n["status"] == "online" for n in r.json()["nodes"]):
                        return creds
            await asyncio.sleep(POLL_S)
    raise RuntimeError(f"heteroflow up not ready within {READY_TIMEOUT_S:g} s")


# --- the multi-container deployment ---------------------------------------------------------


async def measure_compose(args: Any, up: list[Row]) -> list[Row]:
    # The compose runner of the integration tests: this suite measures what that test runs.
    from tests.integration import compose as runner

    why = runner.why_not_here()
    if why:
        return rows("compose", Measured(), up, f"not measured: {why}")
    await asyncio.to_thread(runner.build_images)
    d = await asyncio.to_thread(runner.Compose)
    try:
        agent_env = NODE_ENV | {"HETEROFLOW_RUNTIME": args.deploy_runtime}
        await asyncio.to_thread(d.deploy, agent_env)
        urls, database_url = d.urls, d.database_url
        return rows("compose", await load(urls, d.key, database_url, args), up)
    finally:
        await asyncio.to_thread(d.down)
