"""`python -m bench.supervisor_cpu`: CPU of the process runtime's per-task supervisor.

Starts `--runs` tasks running `true` one after the other through `ProcessRuntime` (the agent's
own code path: the same forker, the same files), waits for each, and divides the CPU of the
forker (its own time and its reaped children's: each supervisor and the job it reaped) by
the number of runs. That is what one trivial task costs the node beyond the agent's
own loop (docs/benchmarks.md, "Where HeteroFlow's CPU per job goes"). Needs no server; CPU
time, unlike wall time, barely depends on what else runs, but a quiet machine is still better.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid

import psutil

from agent.runtimes.base import RunSpec
from agent.runtimes.process import ProcessRuntime
from libs.logging import configure


def _forker_cpu(rt: ProcessRuntime) -> float:
    """The forker's CPU seconds so far, with its reaped children's (every supervisor's)."""
    if rt.forker_pid is None:
        return 0.0
    t = psutil.Process(rt.forker_pid).cpu_times()
    return float(t.user + t.system + t.children_user + t.children_system)


async def _one(rt: ProcessRuntime, command: str, memory_mb: int) -> None:
    spec = RunSpec(
        task_id=f"c{uuid.uuid4().hex[:10]}",
        attempt=0,
        image="none",
        command=command,
        memory_mb=memory_mb,
    )
    handle = await rt.start(spec)
    report = await rt.wait(handle)
    if report.exit_code != 0:
        raise RuntimeError(f"{command!r} ended with {report.exit_code}")
    await rt.remove(handle)


async def measure(runs: int, command: str, memory_mb: int) -> tuple[float, float]:
    """(CPU ms per run, wall ms per run). The forker's own start-up, paid once per agent, is
    left out: one task runs before the measurement."""
    with tempfile.TemporaryDirectory(prefix="hf-supervisor-cpu-") as state:
        rt = ProcessRuntime(state, poll_s=0.005)
        await _one(rt, command, memory_mb)
        cpu0, t0 = _forker_cpu(rt), time.monotonic()
        for _ in range(runs):
            await _one(rt, command, memory_mb)
        cpu, wall = _forker_cpu(rt) - cpu0, time.monotonic() - t0
        await rt.close()
    return cpu / runs * 1000, wall / runs * 1000


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.supervisor_cpu", description=__doc__)
    p.add_argument("--runs", type=int, default=40, help="tasks per measurement (default 40)")
    p.add_argument("--repeat", type=int, default=3, help="measurements (default 3)")
    p.add_argument("--command", default="true", help="the job (default: true)")
    p.add_argument("--memory-mb", type=int, default=2048, help="as a task's default (2048)")
    args = p.parse_args()
    configure("warning")  # not a line per task
    for _ in range(args.repeat):
        cpu, wall = asyncio.run(measure(args.runs, args.command, args.memory_mb))
        print(f"{args.runs} runs of {args.command!r}: {cpu:.1f} ms CPU, {wall:.1f} ms wall each")


if __name__ == "__main__":
    main()
