"""The shedding suite: creates and lists together against the gateway as a user runs it.

`heteroflow service api-gateway` runs in a child process with its default limits (in-flight
bounds, tenant write rate, database wait; docs/api.md#shedding), and an open-loop generator
(bench/httpload.py) sends creates and lists of one tenant at fixed times, each latency
counted from its scheduled send time:

* mixed: 50 requests/s, half creates and half lists (20 tasks a page), for 60 s. Targets:
  lists p99 <= 100 ms; creates served with p99 <= 1 s, or shed (503/429) within 50 ms.
* overload: lists at 25/s beside creates offered far beyond what the gateway can take (600/s
  for 10 s): lists must stay fast while creates are shed.

Afterwards every create answered 201 is looked up in the database: `lost` must be 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from libs import auth
from libs.store.eventstore import EventStore
from libs.store.pool import rows as query

from . import Context
from .gateway_load import GatewayLoad, _free_port, _start, _stop, _wait_ready, percentile
from .httpload import Connection, HttpError, build_request
from .report import Row, target

DESCRIPTION = "creates and lists together: latency, shed answers (503/429), nothing lost"

TENANT = "bench-shed"
CONNECTIONS = 64
REQUEST_TIMEOUT_S = 10.0
SHED_STATUSES = (429, 503)
TARGET_LIST_P99_MS = 100.0
TARGET_CREATE_P99_MS = 1000.0
TARGET_SHED_P99_MS = 50.0
CREATE_BODY = {"name": "shed", "image": "busybox:latest", "command": "true"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("shedding")
    group.add_argument(
        "--mixed-rate", type=float, default=50.0, help="creates + lists per second (default 50)"
    )
    group.add_argument(
        "--mixed-duration", type=float, default=60.0, help="seconds of the mixed run (default 60)"
    )
    group.add_argument(
        "--overload-rate",
        type=float,
        default=600.0,
        help="creates per second offered in the overload run (default 600)",
    )
    group.add_argument(
        "--overload-duration",
        type=float,
        default=10.0,
        help="seconds of the overload run (default 10)",
    )


@dataclass
class Outcomes:
    """What came back for one kind of request: latencies by status class, created ids."""

    sent: int = 0
    served: list[float] = field(default_factory=list)  # 2xx
    shed: list[float] = field(default_factory=list)  # 429 / 503
    other: Counter[str] = field(default_factory=Counter)
    ids: list[str] = field(default_factory=list)


class Client:
    """At most `connections` requests in flight; the others wait their turn (counted)."""

    def __init__(self, port: int, connections: int) -> None:
        self.conns = [Connection("127.0.0.1", port, REQUEST_TIMEOUT_S) for _ in range(connections)]
        self.idle: asyncio.Queue[Connection] = asyncio.Queue()
        for conn in self.conns:
            self.idle.put_nowait(conn)

    async def send(self, raw: bytes) -> tuple[int, bytes]:
        conn = await self.idle.get()
        try:
            return await conn.request(raw)
        finally:
            self.idle.put_nowait(conn)

    async def aclose(self) -> None:
        for conn in self.conns:
            await conn.close()


async def open_loop(
    client: Client, streams: Sequence[tuple[bytes, float, Outcomes]], duration: float
) -> None:
    """Each (request, rate, outcomes) stream sends `rate * duration` requests at fixed times."""
    loop = asyncio.get_running_loop()
    t0 = loop.time() + 0.05

    async def one(raw: bytes, scheduled: float, out: Outcomes) -> None:
        delay = scheduled - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        try:
            status, body = await client.send(raw)
        except HttpError as exc:
            out.other[str(exc)] += 1
            return
        took = loop.time() - scheduled
        if 200 <= status < 300:
            out.served.append(took)
            if status == 201:
                out.ids.append(json.loads(body)["id"])
        elif status in SHED_STATUSES:
            out.shed.append(took)
        else:
            out.other[f"status {status}"] += 1

    jobs = []
    for raw, rate, out in streams:
        out.sent = int(rate * duration)
        jobs += [asyncio.create_task(one(raw, t0 + i / rate, out)) for i in range(out.sent)]
    await asyncio.gather(*jobs)


def _rows(name: str, creates: Outcomes, lists: Outcomes, lost: int) -> list[Row]:
    ms = 1000.0

    def p99(values: list[float]) -> float:
        return percentile(sorted(values), 99) * ms

    other = creates.other + lists.other
    create_p50 = percentile(sorted(creates.served), 50) * ms
    rows = [
        Row(
            f"shedding.{name}.lists_p99",
            p99(lists.served),
            "ms",
            note=f"{len(lists.served)} served",
        ),
        target(f"shedding.{name}.lists_p99", p99(lists.served), TARGET_LIST_P99_MS, "ms", True),
        Row(
            f"shedding.{name}.creates_served",
            len(creates.served),
            "requests",
            note=f"of {creates.sent} sent; p50 {create_p50:.0f} ms",
        ),
        Row(f"shedding.{name}.creates_p99", p99(creates.served), "ms"),
        Row(f"shedding.{name}.creates_shed", len(creates.shed) + len(lists.shed), "requests"),
        Row(f"shedding.{name}.shed_answer_p99", p99(creates.shed + lists.shed), "ms"),
        Row(
            f"shedding.{name}.other_answers",
            sum(other.values()),
            "requests",
            note=", ".join(f"{k}: {v}" for k, v in sorted(other.items())),
        ),
        Row(f"shedding.{name}.lost", lost, "tasks", note="answered 201 but not in the store"),
    ]
    if creates.served:
        rows.insert(
            4,
            target(
                f"shedding.{name}.creates_p99",
                p99(creates.served),
                TARGET_CREATE_P99_MS,
                "ms",
                True,
            ),
        )
    if creates.shed or lists.shed:
        rows.append(
            target(
                f"shedding.{name}.shed_answer_p99",
                p99(creates.shed + lists.shed),
                TARGET_SHED_P99_MS,
                "ms",
                True,
            )
        )
    return rows


async def _lost(store: EventStore, ids: list[str]) -> int:
    found = await query(store, "SELECT count(*) AS n FROM tasks WHERE id = ANY(%s)", (ids,))
    return len(set(ids)) - int(found[0]["n"])


async def run(ctx: Context) -> list[Row]:
    args = ctx.args
    with ctx.database() as url:
        store = await EventStore.open(url, max_size=2)
        try:
            await auth.create_tenant(store, TENANT, "bench")
            _, api_key = await auth.issue_api_key(store, TENANT, "bench")
            port, probe = _free_port(), _free_port()
            load = GatewayLoad(url, ctx.servers.nats_url, api_key, 0.0, 0.0, CONNECTIONS, 1)
            headers = {"Authorization": f"Bearer {api_key}"}
            host = f"127.0.0.1:{port}"
            create = build_request("POST", host, "/api/v1/tasks", headers, CREATE_BODY)
            listing = build_request("GET", host, "/api/v1/tasks?per_page=20", headers, None)
            rows: list[Row] = []
            with tempfile.TemporaryDirectory(prefix="hf-bench-shed-") as home:
                proc = await _start(load, port, probe, home)
                client = Client(port, CONNECTIONS)
                try:
                    await _wait_ready(probe, proc)
                    half = args.mixed_rate / 2
                    mixed = (Outcomes(), Outcomes())
                    streams = [(create, half, mixed[0]), (listing, half, mixed[1])]
                    await open_loop(client, streams, args.mixed_duration)
                    rows += _rows("mixed", *mixed, await _lost(store, mixed[0].ids))
                    over = (Outcomes(), Outcomes())
                    streams = [(create, args.overload_rate, over[0]), (listing, 25.0, over[1])]
                    await open_loop(client, streams, args.overload_duration)
                    rows += _rows("overload", *over, await _lost(store, over[0].ids))
                finally:
                    await _stop(proc)
                    await client.aclose()
            return rows
        finally:
            await store.close()
