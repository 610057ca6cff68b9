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
After each phase a block says PASS or FAIL for each target (`verdicts`): a list that was not
served counts as slower than any target; a create neither served nor shed (a timeout, a 500)
fails "every create served or shed".
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
from .report import Row

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


@dataclass(frozen=True)
class Verdict:
    """One target of the issue's load test, met or not, with what was measured."""

    target: str
    met: bool
    measured: str

    def line(self) -> str:
        return f"  {'PASS' if self.met else 'FAIL'}  {self.target}: {self.measured}"


def _p99_ms(values: Sequence[float]) -> float:
    return percentile(sorted(values), 99) * 1000.0


def verdicts(creates: Outcomes, lists: Outcomes, lost: int) -> list[Verdict]:
    """The targets, each judged: lists p99 <= 100 ms (a list that was not served counts as
    a miss); every create served or shed, served ones p99 <= 1 s, shed ones answered p99 <=
    50 ms; every create answered 201 present afterwards."""
    unserved = lists.sent - len(lists.served)
    # Not served (shed, refused, timed out): slower than any target.
    list_p99 = _p99_ms([*lists.served, *[float("inf")] * unserved])
    create_other = sum(creates.other.values())
    served_p99, shed_p99 = _p99_ms(creates.served), _p99_ms(creates.shed)
    return [
        Verdict(
            f"lists p99 <= {TARGET_LIST_P99_MS:.0f} ms",
            list_p99 <= TARGET_LIST_P99_MS,
            f"{list_p99:.1f} ms ({len(lists.served)} of {lists.sent} served)",
        ),
        Verdict(
            "every create served or shed (503/429)",
            create_other == 0,
            f"{len(creates.served)} served, {len(creates.shed)} shed, {create_other} other"
            + (f" ({_counts(creates.other)})" if create_other else ""),
        ),
        Verdict(
            f"creates served p99 <= {TARGET_CREATE_P99_MS:.0f} ms",
            not creates.served or served_p99 <= TARGET_CREATE_P99_MS,
            f"{served_p99:.1f} ms" if creates.served else "none served",
        ),
        Verdict(
            f"creates shed answered p99 <= {TARGET_SHED_P99_MS:.0f} ms",
            not creates.shed or shed_p99 <= TARGET_SHED_P99_MS,
            f"{shed_p99:.1f} ms" if creates.shed else "none shed",
        ),
        Verdict(
            "nothing lost (every 201 in the store)",
            lost == 0,
            f"{lost} of {len(set(creates.ids))} acknowledged missing",
        ),
    ]


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(counter.items()))


def report(name: str, rate: str, checks: Sequence[Verdict]) -> str:
    """The pass/fail block printed after a phase."""
    met = all(c.met for c in checks)
    lines = [f"shedding.{name} ({rate}):", *(c.line() for c in checks)]
    return "\n".join([*lines, f"shedding.{name}: {'PASS' if met else 'FAIL'}"])


def _rows(name: str, creates: Outcomes, lists: Outcomes, lost: int) -> list[Row]:
    create_p50 = percentile(sorted(creates.served), 50) * 1000.0
    checks = verdicts(creates, lists, lost)
    rows = [
        Row(
            f"shedding.{name}.lists_p99",
            _p99_ms(lists.served),
            "ms",
            note=f"{len(lists.served)} of {lists.sent} served",
        ),
        Row(
            f"shedding.{name}.creates_served",
            len(creates.served),
            "requests",
            note=f"of {creates.sent} sent; p50 {create_p50:.0f} ms",
        ),
        Row(f"shedding.{name}.creates_p99", _p99_ms(creates.served), "ms"),
        Row(f"shedding.{name}.creates_shed", len(creates.shed), "requests"),
        Row(f"shedding.{name}.shed_answer_p99", _p99_ms(creates.shed), "ms"),
        Row(f"shedding.{name}.lists_shed", len(lists.shed), "requests"),
        Row(
            f"shedding.{name}.other_answers",
            sum((creates.other + lists.other).values()),
            "requests",
            note=_counts(creates.other + lists.other),
        ),
        Row(f"shedding.{name}.lost", lost, "tasks", note="answered 201 but not in the store"),
        Row(
            f"shedding.{name}.targets_met",
            sum(c.met for c in checks),
            f"of {len(checks)}",
            note="; ".join(
                f"{'PASS' if c.met else 'FAIL'} {c.target}: {c.measured}" for c in checks
            ),
        ),
    ]
    return rows


async def _lost(store: EventStore, ids: list[str]) -> int:
    found = await query(store, "SELECT count(*) AS n FROM tasks WHERE id = ANY(%s)", (ids,))
    return len(set(ids)) - int(found[0]["n"])


@dataclass(frozen=True)
class Phase:
    """One load phase: creates and lists at their rates for `duration` seconds."""

    name: str
    create_rate: float
    list_rate: float
    duration: float

    def describe(self) -> str:
        return (
            f"creates {self.create_rate:g}/s + lists {self.list_rate:g}/s for {self.duration:g} s"
        )


def phases(args: argparse.Namespace) -> list[Phase]:
    """mixed: the issue's load test (50 requests/s, half creates, 60 s); overload: creates
    far beyond what the gateway takes, beside lists."""
    half = args.mixed_rate / 2
    return [
        Phase("mixed", half, half, args.mixed_duration),
        Phase("overload", args.overload_rate, 25.0, args.overload_duration),
    ]


async def _run_phase(
    client: Client, store: EventStore, requests: tuple[bytes, bytes], phase: Phase
) -> list[Row]:
    """Run one phase, print its pass/fail block, return its rows."""
    creates, lists = Outcomes(), Outcomes()
    streams = [(requests[0], phase.create_rate, creates), (requests[1], phase.list_rate, lists)]
    await open_loop(client, streams, phase.duration)
    lost = await _lost(store, creates.ids)
    print(report(phase.name, phase.describe(), verdicts(creates, lists, lost)), flush=True)
    return _rows(phase.name, creates, lists, lost)


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
                    for phase in phases(args):
                        rows += await _run_phase(client, store, (create, listing), phase)
                finally:
                    await _stop(proc)
                    await client.aclose()
            return rows
        finally:
            await store.close()
