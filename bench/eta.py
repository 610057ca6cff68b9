"""`python -m bench eta`: the pending estimate's error on a simulated fleet with known runtimes.

Tasks of a few (tenant, image) classes arrive on a simulated clock (Poisson, seeded); each
class has a known runtime (lognormal around its mean) and some tasks carry a `timeout` that
ends them. The scheduler's own planner places them at every arrival and end; every task that
has to wait gets the estimate the API would show at its submission
(`services/scheduler/placement/eta.py`), with the typical runtimes learned from the tasks
finished so far. Error = |estimated start - actual start|. Pure: no server is used, and the
same seed gives the same rows.

Rows: median and p90 absolute error (s), the share of actual starts inside the [low, high]
range, the share answered "unknown", and the mean wait of the tasks that waited, for scale.
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from libs.domain.task.states import TaskStatus
from services.scheduler.placement.eta import Holding, Runtime, estimate, runtime_of
from services.scheduler.placement.model import (
    Allocation,
    ClusterSnapshot,
    Gpu,
    Node,
    PendingTask,
    Requirement,
)
from services.scheduler.placement.planner import Planner
from services.scheduler.placement.reasons import Reason

from . import Context
from .report import Row

DESCRIPTION = "pending-task ETA error on a simulated fleet with known runtimes (median, p90)"

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NODES, CARDS = 8, 4
# (tenant, image, mean runtime s, cards)
CLASSES: tuple[tuple[str, str, float, int], ...] = (
    ("t0", "train", 900.0, 4),
    ("t0", "eval", 120.0, 1),
    ("t1", "train", 600.0, 2),
    ("t1", "prep", 60.0, 1),
    ("t2", "sweep", 300.0, 1),
    ("t2", "big", 1800.0, 4),
)
NOISE = 0.35  # lognormal sigma of a class's runtimes
TIMEOUT_SHARE = 0.4  # tasks with a timeout of TIMEOUT_FACTOR x their class's mean
TIMEOUT_FACTOR = 2.0
LOAD = 0.95  # offered card-seconds per card-second of the fleet
SAMPLES = 200  # newest finished tasks a typical runtime is learned from


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("eta")
    group.add_argument("--eta-tasks", type=int, default=600, help="tasks to simulate (600)")
    group.add_argument("--eta-seed", type=int, default=34, help="the simulation's seed (34)")


@dataclass
class Job:
    id: str
    tenant: str
    image: str
    cards: int
    runtime_s: float  # what it really runs (a timeout cuts it)
    timeout_s: int
    submitted: datetime
    started: datetime | None = None
    estimate: tuple[datetime, datetime, datetime] | None = None
    estimated: bool = False  # it waited and was given an answer (an estimate or unknown)


@dataclass
class Sim:
    jobs: dict[str, Job]
    nodes: tuple[Node, ...]
    pending: list[str] = field(default_factory=list)
    running: dict[str, Allocation] = field(default_factory=dict)
    done: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    planner: Planner = field(default_factory=Planner)
    reasons: dict[str, Reason] = field(default_factory=dict)  # the last round's why-not

    def runtime(self, job: Job) -> Runtime | None:
        return runtime_of(self.done.get((job.tenant, job.image), [])[-SAMPLES:])

    def snapshot(self, now: datetime) -> ClusterSnapshot:
        return ClusterSnapshot(now, self.nodes, tuple(self.running.values()))

    def pending_task(self, job: Job) -> PendingTask:
        return PendingTask(job.id, job.tenant, Requirement(gpu_count=job.cards), job.submitted)

    def holding(self) -> dict[str, Holding]:
        out = {}
        for jid in (*self.running, *self.pending):
            job = self.jobs[jid]
            out[jid] = Holding(job.started, job.timeout_s, self.runtime(job))
        return out


def make_jobs(n: int, rng: random.Random) -> list[Job]:
    mean_work = statistics.fmean(mean * cards for _, _, mean, cards in CLASSES)
    gap = mean_work / (LOAD * NODES * CARDS)
    at, jobs = T0, []
    for i in range(n):
        at += timedelta(seconds=rng.expovariate(1 / gap))
        tenant, image, mean, cards = rng.choice(CLASSES)
        true = mean * rng.lognormvariate(0, NOISE)
        timeout = int(mean * TIMEOUT_FACTOR) if rng.random() < TIMEOUT_SHARE else 0
        runs = min(true, timeout) if timeout else true
        jobs.append(Job(f"j{i:05d}", tenant, image, cards, runs, timeout, at))
    return jobs


def fleet() -> tuple[Node, ...]:
    return tuple(
        Node(
            f"n{k}",
            True,
            1 << 20,
            64,
            tuple(Gpu(f"n{k}-g{i}", i, "nvidia", "A100", 81_920) for i in range(CARDS)),
            runtime="simulated",
        )
        for k in range(NODES)
    )


def simulate(n: int, seed: int) -> list[Job]:
    """Every job with its actual start and the estimate it was given on submission."""
    rng = random.Random(seed)
    jobs = make_jobs(n, rng)
    sim = Sim({j.id: j for j in jobs}, fleet())
    events: list[tuple[datetime, int, str, str]] = [(j.submitted, 1, "arrive", j.id) for j in jobs]
    heapq.heapify(events)
    while events:
        now = events[0][0]
        arrived: list[str] = []
        while events and events[0][0] == now:
            _, _, kind, jid = heapq.heappop(events)
            job = sim.jobs[jid]
            if kind == "end":
                del sim.running[jid]
                sim.done.setdefault((job.tenant, job.image), []).append(job.runtime_s)
            else:
                sim.pending.append(jid)
                arrived.append(jid)
        _round(sim, now, events)
        for jid in arrived:
            if sim.jobs[jid].started is None:
                _estimate(sim, sim.jobs[jid], now)
    return jobs


def _round(sim: Sim, now: datetime, events: list[tuple[datetime, int, str, str]]) -> None:
    line = [sim.pending_task(sim.jobs[j]) for j in sim.pending]
    plan = sim.planner.plan(sim.snapshot(now), line)
    for p in plan.placements:
        job = sim.jobs[p.task_id]
        job.started = now
        sim.running[job.id] = Allocation(
            job.id, job.tenant, p.node_id, TaskStatus.RUNNING, gpu_ids=p.gpu_ids
        )
        heapq.heappush(events, (now + timedelta(seconds=job.runtime_s), 0, "end", job.id))
    placed = {p.task_id for p in plan.placements}
    sim.pending = [j for j in sim.pending if j not in placed]
    sim.reasons = {u.task_id: u.reason for u in plan.unplaced}


def _estimate(sim: Sim, job: Job, now: datetime) -> None:
    line = [sim.pending_task(sim.jobs[j]) for j in sim.pending]
    me = next(t for t in line if t.task_id == job.id)
    reason = sim.reasons.get(job.id)
    info = estimate(sim.snapshot(now), me, line, sim.holding(), reason=reason)
    job.estimated = True
    if info.eta is not None:
        job.estimate = (info.eta.at, info.eta.low, info.eta.high)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def rows(jobs: list[Job]) -> list[Row]:
    waited = [(j, j.started) for j in jobs if j.estimated and j.started is not None]
    known = [(j.estimate, started) for j, started in waited if j.estimate is not None]
    errors = [abs((started - at).total_seconds()) for (at, _, _), started in known]
    inside = sum(1 for (_, low, high), started in known if low <= started <= high)
    waits = [(started - j.submitted).total_seconds() for j, started in waited]
    note = f"{len(jobs)} tasks on {NODES}x{CARDS} cards, load {LOAD}, runtime noise {NOISE}"
    return [
        Row(
            "eta.abs_error.p50",
            statistics.median(errors) if errors else float("nan"),
            "s",
            note=note,
        ),
        Row("eta.abs_error.p90", percentile(errors, 0.9), "s"),
        Row("eta.in_range", inside / len(known) if known else float("nan"), "ratio"),
        Row("eta.unknown", (len(waited) - len(known)) / len(waited) if waited else 0.0, "ratio"),
        Row("eta.waited", float(len(waited)), "tasks"),
        Row("eta.wait.mean", statistics.fmean(waits) if waits else 0.0, "s"),
    ]


async def run(ctx: Context) -> list[Row]:
    return rows(simulate(ctx.args.eta_tasks, ctx.args.eta_seed))


def main() -> None:
    from .report import format_table

    print(format_table(rows(simulate(600, 34))))


if __name__ == "__main__":
    main()
