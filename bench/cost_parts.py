"""CPU cost of three parts of the control plane's hot path, each alone (issue 32).

    python -m bench.cost_parts plan  [--nodes 1000] [--tasks 4000] [--small 20] [--repeat 3]
    python -m bench.cost_parts relay [--events 5000] [--repeat 3]
    python -m bench.cost_parts steps [--commands 3000] [--batch 32] [--repeat 3]
    python -m bench.cost_parts reports [--commands 1500] [--batch 32] [--repeat 3]
    python -m bench.cost_parts queue [--backlog 500] [--rounds 50] [--moved 10] [--repeat 3]
    python -m bench.cost_parts pull  [--events 5000] [--batch 32] [--repeat 3]
    python -m bench.cost_parts parse [--repeat 3]

`plan`: the planner in memory on the simulated fleet (no database): a full placement run in
rounds of 512, then rounds of `--small` tasks over what it placed, with the planner's ledger
kept between rounds (brought to each snapshot by scanning its allocations, or by the
snapshot's delta), and built afresh each round (the index kept in all three), alternating
(an older tree, whose planner keeps no ledger, is measured as it plans).
`relay`: `OutboxRelay.run_once` draining `--events` committed task_created events to
JetStream. `steps`: `EventStore.execute_steps` (agent reports) and `execute_batch` (the
placer's commit) in batches of `--batch`, one pending-reason change per command. `reports`:
`--commands` tasks placed, then an agent's three reports of each (starting, running,
completed) through `execute_steps` in batches of `--batch`, each on a document the store
itself committed (keep `--commands` under the store's 2,048 kept documents). `queue`: the
placer's read of a backlog of `--backlog` pending tasks that stay pending, `--rounds` rounds
with `--moved` of them changed before each, read afresh (`view.load_pending` + `pending_of`)
and through the version-keyed `view.PendingQueue`, alternating. `pull`: a `PullLoop` (the
durable consumers' fetch loop) draining `--events` stored messages in batches of up to
`--batch`, each acknowledged. `parse`: the gateway's `parse_create` of a minimal and of a
ten-variable training body (best of 5 × 5,000 calls, no server). Each prints
process CPU time per unit (and wall time, which the fsyncs of PostgreSQL and JetStream
bound). `relay`, `steps` and `reports` use public APIs only, so the file can be run against
an older tree (`PYTHONPATH=OLD python bench/cost_parts.py relay`) for a before/after on the
same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from agent.simulated_fleet import fleet_inventories
from bench import fresh_database, servers
from bench.scheduler_place import MIX
from libs.bus.nats import connect, ensure_streams
from libs.domain.reasons import ReasonCode
from libs.domain.task import decide as commands
from libs.domain.task.model import Task, TaskSpec, TenantId
from libs.domain.task.states import Actor, TaskStatus
from libs.store.eventstore import EventStore
from libs.store.relay import OutboxRelay
from services.scheduler.placement.model import (
    Allocation,
    ClusterSnapshot,
    Gpu,
    Node,
    PendingTask,
    Requirement,
)
from services.scheduler.placement.planner import Planner

NOW = datetime(2026, 12, 1, tzinfo=UTC)
SPEC = TaskSpec(name="bench", image="sim:latest", gpu_required=1)
ROUND = 512


# --- plan ---------------------------------------------------------------------------------


def fleet(n: int) -> tuple[Node, ...]:
    return tuple(
        Node(
            node_id,
            True,
            inv.memory_mb,
            inv.cpu_cores,
            tuple(
                Gpu(g.id, g.index, g.vendor, g.model, g.vram_mb, g.mig_capable) for g in inv.gpus
            ),
        )
        for node_id, inv in fleet_inventories(n)
    )


def pending(n: int, start: int = 0) -> list[PendingTask]:
    out = []
    for i in range(start, start + n):
        gpus, gpu_type, vram = MIX[i % len(MIX)]
        req = Requirement(
            gpu_count=gpus,
            gpu_type=gpu_type,
            gpu_memory_mb=vram,
            gpu_compute_ratio=0.25 if vram else 0.0,
        )
        out.append(PendingTask(f"t{i:06d}", "acme", req, NOW))
    return out


def fill(planner: Planner, nodes: tuple[Node, ...], n_tasks: int) -> ClusterSnapshot:
    """Place `n_tasks` in rounds of ROUND; the snapshot of what they hold."""
    held: dict[str, Allocation] = {}
    todo = pending(n_tasks)
    snap = ClusterSnapshot(NOW, nodes, (), {})
    while todo:
        snap = ClusterSnapshot(NOW, nodes, tuple(held.values()), {})
        placed = planner.plan(snap, todo, max_batch=ROUND).placements
        if not placed:
            break
        for p in placed:
            held[p.task_id] = Allocation(
                p.task_id, "acme", p.node_id, TaskStatus.SCHEDULED, gpu_ids=p.gpu_ids
            )
        done = {p.task_id for p in placed}
        todo = [t for t in todo if t.task_id not in done]
    return ClusterSnapshot(NOW, nodes, tuple(held.values()), {})


def plan_cost(args: argparse.Namespace) -> None:
    nodes = fleet(args.nodes)
    planner = Planner()
    snap = fill(planner, nodes, args.tasks)
    small = pending(args.small, start=args.tasks)
    # A tree whose planner keeps no ledger (before 2026-12-02) is measured as it plans; one
    # whose snapshots carry no delta (before 2026-12-07) without the "delta" mode.
    modes: tuple[str, ...] = ("as this tree plans",)
    unmoved = snap
    if hasattr(planner, "ledger"):
        modes = ("kept", "rebuilt")
        if "delta" in getattr(ClusterSnapshot, "__dataclass_fields__", {}):
            from services.scheduler.placement.model import AllocationDelta

            # Nothing moved since the last round, and the snapshot says so (a cluster view's
            # delta); "kept" finds the same by scanning every allocation.
            unmoved = replace(snap, delta=AllocationDelta(snap.allocations, snap.allocations))
            modes = ("kept", "delta", "rebuilt")
    rounds = 50
    for _ in range(args.repeat):
        spent = {}
        for mode in modes:
            t0 = time.process_time()
            for _ in range(rounds):
                if mode == "rebuilt":
                    planner._ledger = None  # the index stays; the ledger is built afresh
                planner.plan(unmoved if mode == "delta" else snap, small, max_batch=ROUND)
            spent[mode] = (time.process_time() - t0) / rounds * 1e3
        figures = ", ".join(f"ledger {m} {ms:.2f} ms" for m, ms in spent.items())
        print(
            f"plan: {args.small}-task round over {len(snap.allocations)} allocations on "
            f"{args.nodes} nodes: {figures}",
            flush=True,
        )


# --- relay and steps ----------------------------------------------------------------------


async def create(store: EventStore, n: int) -> list[Task]:
    tasks: list[Task] = []
    for i in range(0, n, 500):
        items = [(TenantId("acme"), SPEC, None, None)] * min(500, n - i)
        tasks += await store.create_tasks(items, metadata={"principal": "bench"})
    return tasks


async def relay_once(url: str, nats_url: str, n: int) -> tuple[int, float, float]:
    store = await EventStore.open(url, max_size=4)
    try:
        await create(store, n)
    finally:
        await store.close()
    nc = await connect(nats_url, "bench-cost-relay")
    try:
        await ensure_streams(nc.jetstream())
        relay = OutboxRelay(url, nc.jetstream(), name="bench-cost")
        try:
            c0, w0 = time.process_time(), time.perf_counter()
            got = await relay.run_once()
            return got, time.process_time() - c0, time.perf_counter() - w0
        finally:
            await relay.close()
    finally:
        await nc.drain()


def why(text: str) -> Any:
    return lambda t: list(commands.decide_pending_reason(t, ReasonCode.POOL_CAPACITY, text))


async def steps_once(url: str, n: int, batch: int) -> dict[str, tuple[float, float]]:
    store = await EventStore.open(url, max_size=4)
    try:
        ids = [t.id for t in await create(store, n)]
        out = {}
        for mode in ("execute_steps", "execute_batch"):
            c0, w0 = time.process_time(), time.perf_counter()
            for k in range(0, n, batch):
                chunk: Sequence[str] = ids[k : k + batch]
                decide = why(f"{mode} {k}")
                if mode == "execute_steps":
                    meta = {"node_id": "n", "fact": "x"}
                    await store.execute_steps([(i, decide, meta) for i in chunk])
                else:
                    await store.execute_batch(dict.fromkeys(chunk, decide))
            out[mode] = (time.process_time() - c0, time.perf_counter() - w0)
        return out
    finally:
        await store.close()


REPORTED = (TaskStatus.STARTING, TaskStatus.RUNNING, TaskStatus.COMPLETED)


def reported(to: TaskStatus) -> Any:
    return lambda t: list(
        commands.decide_transition(t, to, actor=Actor.AGENT, reason_code=ReasonCode.REPORTED)
    )


async def reports_once(url: str, n: int, batch: int) -> tuple[float, float]:
    """`n` tasks placed, then their reports (starting, running, completed) through
    `execute_steps` in batches of `batch`, as the report consumer writes them: (CPU, wall)
    seconds of the reports. Every task's document is one this store committed."""
    store = await EventStore.open(url, max_size=4)
    try:
        ids = [t.id for t in await create(store, n)]
        placed = commands.decide_transition
        for k in range(0, n, ROUND):
            await store.execute_batch(
                {
                    i: lambda t: list(
                        placed(
                            t,
                            TaskStatus.SCHEDULED,
                            actor=Actor.SCHEDULER,
                            expected_status=TaskStatus.PENDING,
                            reason_code=ReasonCode.PLACED,
                            node_id="n",
                        )
                    )
                    for i in ids[k : k + ROUND]
                }
            )
        c0, w0 = time.process_time(), time.perf_counter()
        for to in REPORTED:
            decide = reported(to)
            for k in range(0, n, batch):
                meta = {"node_id": "n", "fact": to.value}
                await store.execute_steps([(i, decide, meta) for i in ids[k : k + batch]])
        return time.process_time() - c0, time.perf_counter() - w0
    finally:
        await store.close()


async def queue_once(url: str, backlog: int, rounds: int, moved: int) -> dict[str, float]:
    """CPU seconds of `rounds` reads of the pending queue, each way (see the module doc)."""
    from services.scheduler import view

    store = await EventStore.open(url, max_size=4)
    try:
        ids = [t.id for t in await create(store, backlog)]
        out = dict.fromkeys(("afresh", "version-keyed"), 0.0)
        queue = view.PendingQueue()
        await queue.load(store, backlog)  # the first round parses everything either way
        for r in range(rounds):
            chunk = ids[(r * moved) % backlog :][:moved]
            await store.execute_batch(dict.fromkeys(chunk, why(f"round {r}")))
            for mode in out if r % 2 else reversed(list(out)):
                c0 = time.process_time()
                if mode == "afresh":
                    [view.pending_of(t) for t in await view.load_pending(store, backlog)]
                else:
                    queue.pendings(await queue.load(store, backlog))
                out[mode] += time.process_time() - c0
        return out
    finally:
        await store.close()


async def pull_once(nats_url: str, n: int, batch: int) -> tuple[float, float]:
    """CPU and wall seconds of a `PullLoop` draining `n` stored messages, each acked."""
    from libs.bus.nats import ensure_durable_consumer
    from libs.bus.pull import PullLoop
    from libs.bus.subjects import EVENTS_PREFIX, EVENTS_STREAM

    tag = uuid.uuid4().hex[:8]
    nc = await connect(nats_url, "bench-cost-pull")
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        for k in range(0, n, 500):
            await asyncio.gather(
                *(
                    js.publish(f"{EVENTS_PREFIX}.bench{tag}.t{i}.x", b'{"n": %d}' % i)
                    for i in range(k, min(n, k + 500))
                )
            )
        durable = f"bench-pull-{tag}"
        await ensure_durable_consumer(
            js, EVENTS_STREAM, durable, f"{EVENTS_PREFIX}.bench{tag}.>", max_ack_pending=n
        )
        done, seen = asyncio.Event(), [0]

        async def consume(messages: list[Any]) -> None:
            for m in messages:
                await m.ack()
            seen[0] += len(messages)
            if seen[0] >= n:
                done.set()

        loop = PullLoop(nc, EVENTS_STREAM, durable, consume, batch=batch)
        await loop.open()
        c0, w0 = time.process_time(), time.perf_counter()
        task = asyncio.create_task(loop.run())
        await done.wait()
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        loop.stop(task)
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return cpu, wall
    finally:
        await nc.drain()


PARSE_BODIES: dict[str, dict[str, Any]] = {
    "minimal": {"name": "peer", "command": "true"},
    "training": {
        "name": "train",
        "image": "ghcr.io/acme/trainer:v2",
        "command": "python train.py --epochs 3",
        "gpu_required": 2,
        "env": {f"K{i}": "v" * 40 for i in range(10)},
        "labels": {"team": "ml"},
    },
}


def parse_cost(args: argparse.Namespace) -> None:
    import timeit

    from libs.domain.task.model import parse_create

    for _ in range(args.repeat):
        line = []
        for name, body in PARSE_BODIES.items():
            n = 5_000

            def once(b: dict[str, Any] = body) -> None:
                parse_create(b, tenant=True)

            best = min(timeit.repeat(once, number=n, repeat=5))
            line.append(f"{name} {best / n * 1e6:.1f} us")
        print("parse_create: " + ", ".join(line), flush=True)


def store_cost(args: argparse.Namespace) -> None:
    with servers() as srv:
        for _ in range(args.repeat):
            if args.part == "pull":
                cpu, wall = asyncio.run(pull_once(srv.nats_url, args.events, args.batch))
                print(
                    f"pull: {args.events} messages in batches of up to {args.batch}, CPU "
                    f"{cpu / args.events * 1e6:.0f} us/message, {args.events / wall:,.0f} "
                    "messages/s wall",
                    flush=True,
                )
                continue
            with fresh_database(srv.database_url) as url:
                if args.part == "queue":
                    spent = asyncio.run(queue_once(url, args.backlog, args.rounds, args.moved))
                    print(
                        "queue: "
                        + ", ".join(
                            f"{mode} {cpu / args.rounds * 1e3:.2f} ms/round"
                            for mode, cpu in spent.items()
                        )
                        + f" (backlog {args.backlog}, {args.moved} moved per round)",
                        flush=True,
                    )
                    continue
                if args.part == "reports":
                    cpu, wall = asyncio.run(reports_once(url, args.commands, args.batch))
                    n = args.commands * len(REPORTED)
                    print(
                        f"reports: {n} in batches of {args.batch}, CPU {cpu / n * 1e6:.0f} "
                        f"us/report, {n / wall:,.0f} reports/s wall",
                        flush=True,
                    )
                    continue
                if args.part == "relay":
                    got, cpu, wall = asyncio.run(relay_once(url, srv.nats_url, args.events))
                    print(
                        f"relay: {got} events, CPU {cpu / got * 1e6:.0f} us/event, "
                        f"{got / wall:,.0f} events/s wall",
                        flush=True,
                    )
                    continue
                for mode, (cpu, wall) in asyncio.run(
                    steps_once(url, args.commands, args.batch)
                ).items():
                    print(
                        f"{mode}: batches of {args.batch}, CPU {cpu / args.commands * 1e6:.0f} "
                        f"us/command, {args.commands / wall:,.0f} commands/s wall",
                        flush=True,
                    )


def main() -> None:
    parser = argparse.ArgumentParser(description="CPU cost of parts of the hot path")
    parser.add_argument(
        "part", choices=("plan", "relay", "steps", "reports", "queue", "pull", "parse")
    )
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--tasks", type=int, default=4_000)
    parser.add_argument("--small", type=int, default=20)
    parser.add_argument("--events", type=int, default=5_000)
    parser.add_argument("--commands", type=int, default=3_000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--backlog", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--moved", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.part == "plan":
        plan_cost(args)
    elif args.part == "parse":
        parse_cost(args)
    else:
        store_cost(args)


if __name__ == "__main__":
    main()
