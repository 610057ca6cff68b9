"""The scheduler suite: placement throughput, submit-to-running latency, node-loss recovery.

* Committed placements (scheduler_place.py): simulated fleets (1,000 and 10,000 nodes of five
  GPU kinds) are registered as `node_registered` events, N pending tasks of mixed shapes are
  created with `create_tasks`, then `Placer.round()` runs until a round places nothing. A
  placement counts once its CAS transition to `scheduled` has committed in PostgreSQL.
  Compared with the batched INSERT floor: a placement commits an event row and a projection
  row. The events are then relayed to JetStream at once, against the pipelined publish floor.
* Submit to running (scheduler_path.py): the whole path at a steady rate on 1,000 nodes over
  the bench's NATS: the outbox relay and the scheduler service in this process, a simulated
  fleet (agent/simulated_fleet.py) in a child process. Tasks are created in the store at fixed
  times (an open loop); latency is the `running` event's time minus the task's creation time,
  both read back from the events table, so nothing in the load generator is on the clock.
* Node loss: after the steady run, the node running the most tasks falls silent; the node
  monitor (with a short offline threshold, reported) must mark it offline and requeue its
  tasks, and the scheduler must get them running elsewhere.
* Highest steady rate (scheduler_steps.py): after the node-loss run, the offered rate is
  stepped up until submit → running p99 exceeds 2 s; the row is the highest rate within it.
* Memory: the process's RSS after each placement run, and the planner's own allocations for
  one round (tracemalloc), labelled as what they are.

Targets are printed as `<metric>.target` rows: their ratio is measured / target for rates and
target / measured for times, so a ratio of at least 1.00 means the target is met.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

from agent.simulated_fleet import fleet_inventories
from libs.store.eventstore import EventStore

from . import Context
from .report import Row, against
from .scheduler_path import HOPS, FleetProcess, PathResult, run_path
from .scheduler_path import SETTLE_TIMEOUT_S as SETTLE_S
from .scheduler_place import (
    NAN,
    ROUND_BATCH,
    STEADY_SPEC,
    TENANT,
    PlacementResult,
    placement_run,
)
from .scheduler_steps import DEFAULT_RATES, DEFAULT_STEP_S, Search, search
from .scheduler_steps import rows as step_rows

DESCRIPTION = "placements/s at 1k and 10k nodes, submit-to-running latency, node-loss recovery"

# Targets (what the platform promises at these sizes).
TARGET_PLACE_1K = 10_000.0  # issue 32 (5,000 before it)
TARGET_PLACE_10K = 5_000.0  # issue 32 (2,000 before it)
TARGET_P99_MS = 500.0
TARGET_REQUEUE_S = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("scheduler")
    group.add_argument(
        "--nodes",
        type=_sizes,
        default=[1_000, 10_000],
        help="fleet sizes for the placement runs (default 1000,10000)",
    )
    group.add_argument(
        "--tasks", type=int, default=4_000, help="pending tasks per placement run (default 4000)"
    )
    group.add_argument(
        "--queues",
        type=int,
        default=10,
        help="queues in the extra placement run on the first fleet size (0: no such run)",
    )
    group.add_argument(
        "--sched-rate",
        type=float,
        default=100.0,
        help="tasks/s submitted in the submit-to-running run (default 100)",
    )
    group.add_argument(
        "--sched-duration",
        type=float,
        default=20.0,
        help="seconds of the submit-to-running run (default 20)",
    )
    group.add_argument(
        "--sched-fleet",
        type=int,
        default=1_000,
        help="nodes in the submit-to-running and node-loss runs (default 1000)",
    )
    group.add_argument(
        "--sched-replicas",
        type=int,
        default=1,
        help="scheduler service replicas in the end-to-end run (default 1)",
    )
    group.add_argument(
        "--step-rates",
        type=_rates,
        default=DEFAULT_RATES,
        help="offered rates of the rate search, tasks/s, in order; empty: no search "
        f"(default {','.join(f'{r:g}' for r in DEFAULT_RATES)})",
    )
    group.add_argument(
        "--step-seconds",
        type=float,
        default=DEFAULT_STEP_S,
        help=f"seconds of each step of the rate search (default {DEFAULT_STEP_S:g})",
    )
    group.add_argument(
        "--offline-after",
        type=float,
        default=3.0,
        help="node monitor offline threshold in the node-loss run, s (default 3)",
    )


def _sizes(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _rates(text: str) -> tuple[float, ...]:
    return tuple(float(part) for part in text.split(",") if part.strip())


async def run(ctx: Context) -> list[Row]:
    args = ctx.args
    # The end-to-end part first: the placement runs relay their events afterwards, and the
    # scheduler's durable consumers should not have to wade through them. The rate search
    # runs last in it, on the same control plane and fleet.
    found = Search()

    async def rate_search(store: EventStore, fleet: FleetProcess) -> None:
        nonlocal found
        if args.step_rates:
            cards = sum(len(inv.gpus) for _, inv in fleet_inventories(args.sched_fleet))
            found = await search(
                store,
                fleet,
                STEADY_SPEC,
                TENANT,
                rates=args.step_rates,
                step_s=args.step_seconds,
                cards=cards,
            )

    with ctx.database() as url:
        path = await run_path(
            url,
            ctx.servers.nats_url,
            nodes=args.sched_fleet,
            rate=args.sched_rate,
            duration=args.sched_duration,
            offline_after=args.offline_after,
            spec=STEADY_SPEC,
            tenant=TENANT,
            replicas=args.sched_replicas,
            then=rate_search,
        )
    rows: list[Row] = []
    for i, n in enumerate(args.nodes):
        with ctx.database() as url:
            result = await placement_run(url, ctx.servers.nats_url, n, args.tasks, drain=i == 0)
            rows += placement_rows(ctx, result)
        if i == 0 and args.queues:
            with ctx.database() as url:
                queued = await placement_run(
                    url, ctx.servers.nats_url, n, args.tasks, queues=args.queues
                )
                rows += placement_rows(ctx, queued)
    return rows + path_rows(path) + step_rows(ctx, found, args.step_seconds)


# --- committed placements -----------------------------------------------------------------


def _size(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def placement_rows(ctx: Context, r: PlacementResult) -> list[Row]:
    prefix = f"scheduler.place.{_size(r.nodes)}_nodes"
    if r.queues:
        prefix += f"_{r.queues}_queues"
    metric = f"{prefix}.committed"
    other = r.seconds - r.plan_seconds
    note = (
        f"{r.placed} of {r.tasks} placed in {r.rounds} rounds, {r.seconds:.1f} s "
        f"(planner {r.plan_seconds:.1f} s, reads and commits {other:.1f} s); "
        f"{r.left_pending} left pending"
    )
    rows = [against(metric, r.rate, "placements/s", ctx.floors.pg_batched, note)]
    target = {1_000: TARGET_PLACE_1K, 10_000: TARGET_PLACE_10K}.get(r.nodes)
    if r.queues:
        note += f"; {r.queues} queues over 2 pools, quotas not binding"
    if target:
        rows.append(_target(metric, r.rate, target, "placements/s"))
    planned = r.placed / r.plan_seconds if r.plan_seconds else NAN
    rows += [
        Row(f"{prefix}.planner_only", planned, "placements/s", note="plan() alone, same rounds"),
        Row(f"{prefix}.view_cold_load", r.cold_load_seconds, "s", note="first read of the fleet"),
        Row(
            f"{prefix}.process_rss",
            r.rss_after,
            "MiB",
            note="the whole bench process after the run (everything in it, not the planner alone)",
        ),
        Row(
            f"{prefix}.view_held",
            r.view_size,
            "MiB",
            note="tracemalloc: what the scheduler's view of nodes and holding tasks keeps",
        ),
        Row(
            f"{prefix}.plan_peak_alloc",
            r.plan_peak,
            "MiB",
            note=f"tracemalloc peak of one plan() of {ROUND_BATCH} tasks, index built afresh",
        ),
    ]
    if r.drain_seconds:
        rows.append(
            against(
                "scheduler.relay.drain_after_placement",
                r.drained / r.drain_seconds,
                "events/s",
                ctx.floors.js_pipelined,
                f"{r.drained} events in {r.drain_seconds:.1f} s",
            )
        )
    return rows


def path_rows(p: PathResult) -> list[Row]:
    s, loss = p.steady, p.loss
    lat = sorted(s.latencies)
    ms = 1000.0
    offered = Row(
        "scheduler.steady.offered_rate",
        s.rate,
        "tasks/s",
        note=f"{p.nodes} nodes, {p.replicas} scheduler replica(s)",
    )
    submitted = len(s.submitted)
    p99 = percentile(lat, 99) * ms
    requeue = loss.to_offline + loss.to_pending
    rows = [
        offered,
        against(
            "scheduler.steady.submitted_rate",
            submitted / s.submit_seconds if s.submit_seconds else 0.0,
            "tasks/s",
            offered,
            f"{submitted} created in {s.submit_seconds:.1f} s; sender late by "
            f"{s.send_lag_max * ms:.0f} ms at most",
        ),
        Row(
            "scheduler.steady.reached_running",
            len(lat),
            "tasks",
            note=f"of {submitted}, within {SETTLE_S:g} s of the last submit",
        ),
        Row("scheduler.steady.submit_to_running_p50", percentile(lat, 50) * ms, "ms"),
        Row("scheduler.steady.submit_to_running_p99", p99, "ms"),
        _target("scheduler.steady.submit_to_running_p99", p99, TARGET_P99_MS, "ms", True),
        Row("scheduler.steady.submit_to_running_max", (lat[-1] if lat else NAN) * ms, "ms"),
        *(
            Row(
                f"scheduler.steady.hop_{hop}_p99",
                percentile(s.hops.get(hop, []), 99) * ms,
                "ms",
                note=f"p50 {percentile(s.hops.get(hop, []), 50) * ms:.0f} ms; {HOP_TEXT[hop]}",
            )
            for hop in HOPS
        ),
        Row(
            "scheduler.node_loss.offline_threshold",
            loss.threshold,
            "s",
            note="node monitor setting for this run (product default 10 s); heartbeats every 1 s",
        ),
        Row(
            "scheduler.node_loss.silence_to_offline",
            loss.to_offline,
            "s",
            note=f"node {loss.node_id} with {loss.tasks} running tasks falls silent",
        ),
        Row(
            "scheduler.node_loss.offline_to_pending",
            loss.to_pending,
            "s",
            note="the last of its tasks back in pending",
        ),
        Row(
            "scheduler.node_loss.silence_to_pending",
            requeue,
            "s",
            note="detection and requeue: about the threshold plus up to one 1 s monitor tick",
        ),
        _target("scheduler.node_loss.silence_to_pending", requeue, TARGET_REQUEUE_S, "s", True),
        Row(
            "scheduler.node_loss.offline_to_running",
            loss.to_running,
            "s",
            note="the last of its tasks running on another node",
        ),
        Row(
            "scheduler.node_loss.false_offline",
            loss.false_offline,
            "nodes",
            note="other nodes declared offline during the whole end-to-end run",
        ),
    ]
    return rows


HOP_TEXT = {
    "placed": "created -> scheduled: the placement loop",
    "started": "scheduled -> starting: relay, dispatch, command, the node's report, its handling",
    "running": "starting -> running: the node's next report and its handling",
}


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (NaN when empty)."""
    if not sorted_values:
        return NAN
    rank = max(1, min(len(sorted_values), math.ceil(q / 100 * len(sorted_values))))
    return sorted_values[rank - 1]


def _target(
    metric: str, value: float, target: float, unit: str, lower_is_better: bool = False
) -> Row:
    """A target row; ratio >= 1 means met (measured/target, or target/measured for a time)."""
    if value != value:  # NaN: nothing measured
        ratio = None
    elif lower_is_better:
        ratio = target / value if value else None
    else:
        ratio = value / target if target else None
    return Row(f"{metric}.target", target, unit, metric, ratio)
