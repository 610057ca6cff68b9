"""The peer benchmark's workloads, the same for every system.

* burst: `burst` trivial jobs (`true`) submitted at once (at most `concurrency` submissions
  in flight); makespan from the first submission to the moment the system reports no job
  left, jobs/s = burst / makespan, and the control plane's CPU time over that window per job.
* steady: `rate` jobs/s for `steady_s` seconds, open loop (each job has its scheduled send
  time and a late sender counts against the system); each job writes `date +%s.%N` to a file
  of its own, so submit → process started is measured from the scheduled send time to the
  moment the job's own process ran; p50 and p99.
* wide: `wide` jobs of `date …; sleep wide_sleep` submitted at once; how long until the last
  of them started.

Completion is polled every `poll_s` (squeue, `GET /tasks/stats`), which the systems' CPU
figures include alike.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from ..gateway_load import percentile
from . import cpu
from .systems import System

NAN = float("nan")
TRIVIAL = "true"


@dataclass(frozen=True)
class Sizes:
    burst: int = 500
    rate: float = 10.0
    steady_s: float = 30.0
    wide: int = 64
    wide_sleep: float = 10.0
    concurrency: int = 16
    poll_s: float = 0.25
    timeout_s: float = 600.0  # per workload


Results = dict[str, float]


async def submit_all(system: System, commands: list[str], concurrency: int) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(command: str) -> None:
        async with gate:
            await system.submit(command)

    await asyncio.gather(*(one(c) for c in commands))


async def until(check: Callable[[], Awaitable[bool]], poll_s: float, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done within {timeout_s:g} s")
        await asyncio.sleep(poll_s)


async def drained(system: System, sizes: Sizes) -> None:
    async def idle() -> bool:
        return await system.active() == 0

    await until(idle, sizes.poll_s, sizes.timeout_s)


@dataclass
class BurstCpu:
    control_plane: cpu.CpuSample
    helpers: cpu.CpuSample  # e.g. munged
    per_job: float  # seconds, sampled, e.g. slurmstepd

    def note(self, jobs: int) -> str:
        top = sorted(self.control_plane.by_name.items(), key=lambda kv: -kv[1])[:4]
        text = "burst CPU: " + ", ".join(f"{n} {s:.1f} s" for n, s in top)
        if self.helpers.by_name:
            named = ", ".join(f"{n} {s:.1f} s" for n, s in self.helpers.by_name.items())
            text += f"; beside it, not in the table: {named}"
        if self.per_job:
            text += f", per-job processes ≥ {self.per_job * 1000 / jobs:.1f} ms/job (sampled)"
        return text


async def burst(system: System, sizes: Sizes) -> tuple[Results, BurstCpu]:
    sampler = cpu.Sampler(system.per_job_names)
    helpers_before = cpu.cpu_seconds(system.helpers())
    before = cpu.cpu_seconds(system.control_plane())
    started = time.monotonic()
    watch = asyncio.create_task(_sample(sampler)) if system.per_job_names else None
    try:
        await submit_all(system, [TRIVIAL] * sizes.burst, sizes.concurrency)
        await drained(system, sizes)
    finally:
        if watch is not None:
            watch.cancel()
    makespan = time.monotonic() - started
    used = cpu.delta(before, cpu.cpu_seconds(system.control_plane()))
    helpers = cpu.delta(helpers_before, cpu.cpu_seconds(system.helpers()))
    return {
        "burst_makespan_s": makespan,
        "burst_jobs_per_s": sizes.burst / makespan,
        "cpu_ms_per_job": used.seconds * 1000 / sizes.burst,
    }, BurstCpu(used, helpers, sampler.seconds)


async def _sample(sampler: cpu.Sampler, every_s: float = 0.05) -> None:
    while True:
        await asyncio.to_thread(sampler.sample)
        await asyncio.sleep(every_s)


def marker(folder: Path, key: str) -> str:
    """A shell command that records when the job's process ran, in `folder/key`."""
    return f"date +%s.%N > {folder / key}.tmp && mv {folder / key}.tmp {folder / key}"


def fresh(folder: Path) -> None:
    folder.mkdir(parents=True)


def read_starts(folder: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for path in folder.iterdir():
        if path.suffix != ".tmp":
            try:
                out[path.name] = float(path.read_text())
            except ValueError:
                continue  # being written; the next poll reads it
    return out


async def all_started(folder: Path, n: int, sizes: Sizes) -> dict[str, float]:
    async def every() -> bool:
        return len(read_starts(folder)) >= n

    await until(every, sizes.poll_s, sizes.timeout_s)
    return read_starts(folder)


async def steady(system: System, sizes: Sizes, folder: Path) -> Results:
    fresh(folder)
    n = max(1, round(sizes.rate * sizes.steady_s))
    loop = asyncio.get_running_loop()
    t0, wall0 = loop.time() + 0.1, time.time() + 0.1
    sends: list[asyncio.Task[None]] = []
    for i in range(n):
        await asyncio.sleep(max(0.0, t0 + i / sizes.rate - loop.time()))
        sends.append(asyncio.create_task(system.submit(marker(folder, f"j{i}"))))
    await asyncio.gather(*sends)
    starts = await all_started(folder, n, sizes)
    await drained(system, sizes)
    lat = sorted((starts[f"j{i}"] - (wall0 + i / sizes.rate)) * 1000 for i in range(n))
    return {"steady_p50_ms": percentile(lat, 50), "steady_p99_ms": percentile(lat, 99)}


async def wide(system: System, sizes: Sizes, folder: Path) -> Results:
    fresh(folder)
    wall0 = time.time()
    commands = [f"{marker(folder, f'w{i}')}; sleep {sizes.wide_sleep:g}" for i in range(sizes.wide)]
    await submit_all(system, commands, sizes.concurrency)
    starts = await all_started(folder, sizes.wide, sizes)
    await drained(system, sizes)
    return {"wide_all_running_s": max(starts.values()) - wall0}


async def measure(system: System, sizes: Sizes, folder: Path) -> tuple[Results, list[str]]:
    """Every workload on one started system, in turn. A workload that fails (a job that
    never ends, a refused submission) leaves its figures and the later workloads' NaN with
    a note: what it left behind would only skew them (and make each wait out its timeout)."""
    results: Results = {}
    notes: list[str] = []
    try:
        figures, used = await burst(system, sizes)
        results |= figures
        notes.append(used.note(sizes.burst))
        for run in (steady, wide):
            results |= await run(system, sizes, folder / run.__name__)
    except Exception as e:  # noqa: BLE001 - reported in the table's notes
        done = {"burst" if k.startswith(("burst", "cpu")) else k.split("_")[0] for k in results}
        left = [w for w in ("burst", "steady", "wide") if w not in done]
        notes.append(f"{left[0]} failed ({type(e).__name__}: {e}); not run: {left[1:] or '-'}")
        notes.append(f"jobs still active at the end: {await _active(system)}")
    if throttled := getattr(system, "throttled", 0):
        notes.append(f"{throttled} creates answered 429/503 and were sent again after Retry-After")
    return results, notes


async def _active(system: System) -> int | str:
    try:
        return await system.active()
    except Exception as e:  # noqa: BLE001 - a note, not a result
        return f"unknown ({e})"
