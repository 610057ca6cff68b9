"""The scheduler suite's rate search: the highest steady rate with submit → running p99 ≤ 2 s.

It runs on the end-to-end part's control plane and simulated fleet, after the node-loss run.
The offered rate is stepped up (default 50, 100, 150, 200, 300, 400, 600 tasks/s). Each step:

1. the fleet ends every running task (exit 0, as finished work does) and the step waits until
   none is running, so every step starts with the whole fleet free and none queues behind
   the one before;
2. tasks are created at the step's rate for `step_s` seconds (an open loop, as the steady run);
3. it waits until all of them run, or until `LIMIT_S` + `MARGIN_S` after the last submit:
   a task not running by then has waited longer than the limit whatever its submit time, so
   it counts as over the limit in the p99 (which is taken over every submitted task).

Each step also reports the CPU this process spent during 2 and 3 per submitted task: the
control plane it runs (relay, scheduler service) and the load generator's creates, with the
fixed costs of those seconds (the fleet's heartbeats); the simulated fleet is a child
process and not in it.

The search stops at the first step whose p99 is over the limit; the row is the highest rate
whose step stayed within it. A step that would need more cards than the fleet has is not run
(it would measure the fleet's size, not the path). Bounded: at most `len(rates)` steps of
`step_s` + 3 s + the fleet's drain each, about 2 minutes with the defaults.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from libs.domain.task.model import TaskSpec, TenantId
from libs.store.eventstore import EventStore

from .report import Row, against
from .scheduler_path import SETTLE_TIMEOUT_S, FleetProcess, _until, none_running, steady_load

if TYPE_CHECKING:
    from . import Context

LIMIT_S = 2.0
MARGIN_S = 1.0
DEFAULT_RATES = (50.0, 100.0, 150.0, 200.0, 300.0, 400.0, 600.0)
DEFAULT_STEP_S = 8.0
TARGET_RATE = 1_000.0  # issue 32 (300 before it)
# JetStream messages on one task's path: four events relayed (created, scheduled, starting,
# running), one start command, two reports, every one fsynced: the pipelined publish floor
# divided by this is the rate one publishing client would allow (the path has several).
MESSAGES_PER_TASK = 7


@dataclass
class Step:
    rate: float
    submitted: int = 0
    reached: int = 0  # running within the wait
    p50_s: float = math.nan
    p99_s: float = math.nan  # over every submitted task, the unreached ones as infinite
    send_lag_max_s: float = 0.0
    cpu_s: float = 0.0  # this process's CPU during the load and the wait
    wall_s: float = 0.0

    @property
    def cpu_ms_per_task(self) -> float:
        return self.cpu_s / self.submitted * 1000 if self.submitted else math.nan

    @property
    def within(self) -> bool:
        return self.p99_s <= LIMIT_S


@dataclass
class Search:
    steps: list[Step] = field(default_factory=list)
    skipped: list[float] = field(default_factory=list)  # rates beyond the fleet's cards

    @property
    def highest(self) -> float:
        ok = [s.rate for s in self.steps if s.within]
        return max(ok) if ok else 0.0


def nearest_rank(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(1, min(len(ordered), math.ceil(q / 100 * len(ordered)))) - 1]


async def search(
    store: EventStore,
    fleet: FleetProcess,
    spec: TaskSpec,
    tenant: TenantId,
    *,
    rates: tuple[float, ...],
    step_s: float,
    cards: int,
) -> Search:
    """Step the offered rate until a step's p99 exceeds `LIMIT_S` (see the module doc)."""
    out = Search()
    for rate in rates:
        if rate * step_s * max(spec.gpu_required, 1) > cards:
            out.skipped.append(rate)
            continue
        await fleet.call({"op": "finish"})
        with contextlib.suppress(TimeoutError):
            await _until(none_running(store), SETTLE_TIMEOUT_S)
        cpu, wall = time.process_time(), time.perf_counter()
        run = await steady_load(store, spec, tenant, rate, step_s, settle_s=LIMIT_S + MARGIN_S)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        missing = len(run.submitted) - len(run.latencies)
        waits = run.latencies + [math.inf] * missing
        step = Step(
            rate,
            submitted=len(run.submitted),
            reached=len(run.latencies),
            p50_s=nearest_rank(waits, 50),
            p99_s=nearest_rank(waits, 99),
            send_lag_max_s=run.send_lag_max,
            cpu_s=cpu,
            wall_s=wall,
        )
        out.steps.append(step)
        if not step.within:
            break
    return out


def rows(ctx: Context, result: Search, step_s: float) -> list[Row]:
    if not result.steps:
        return []
    ms = 1000.0
    tried = ", ".join(
        f"{s.rate:g}/s: p99 {_ms(s.p99_s)} ({s.reached}/{s.submitted} running)"
        for s in result.steps
    )
    if result.skipped:
        tried += "; not run (more tasks than cards): " + ", ".join(f"{r:g}" for r in result.skipped)
    metric = "scheduler.steady.highest_rate_p99_2s"
    highest = result.highest
    ceiling = ctx.floors.js_pipelined.value / MESSAGES_PER_TASK
    out = [
        against(
            metric,
            highest,
            "tasks/s",
            ctx.floors.js_pipelined,
            f"stepped {step_s:g} s each: {tried}; a task is {MESSAGES_PER_TASK} fsynced JetStream"
            f" messages: the floor / {MESSAGES_PER_TASK} = {ceiling:,.0f} tasks/s (one client;"
            " the path publishes from several)",
        ),
        Row(
            f"{metric}.target",
            TARGET_RATE,
            "tasks/s",
            metric,
            highest / TARGET_RATE,
        ),
    ]
    for s in result.steps:
        out.append(
            Row(
                f"scheduler.step.{s.rate:g}_per_s.submit_to_running_p99",
                s.p99_s * ms if math.isfinite(s.p99_s) else math.nan,
                "ms",
                note=f"p50 {_ms(s.p50_s)}; {s.reached} of {s.submitted} running within "
                f"{LIMIT_S + MARGIN_S:g} s of the last submit; sender late by "
                f"{s.send_lag_max_s * ms:.0f} ms at most",
            )
        )
        out.append(
            Row(
                f"scheduler.step.{s.rate:g}_per_s.cpu_per_task",
                s.cpu_ms_per_task,
                "ms",
                note=f"this process (control plane and load generator; the fleet is a child "
                f"process): {s.cpu_s:.1f} s of CPU over {s.wall_s:.1f} s, "
                f"{s.cpu_s / s.wall_s if s.wall_s else math.nan:.2f} of a core",
            )
        )
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms" if math.isfinite(seconds) else "over the wait"
