"""`python -m bench.supervisor_cpu`: CPU of the process runtime's per-task supervisor.

Starts `--runs` tasks running `true` one after the other through `ProcessRuntime` (the agent's
own code path: the same command line, the same files), waits for each, and divides the
CPU of the reaped children (`getrusage(RUSAGE_CHILDREN)`: each supervisor and the job it
reaped) by the number of runs. That is what one trivial task costs the node beyond the agent's
own loop (docs/benchmarks.md, "Where HeteroFlow's CPU per job goes"). Needs no server; CPU
time, unlike wall time, barely depends on what else runs, but a quiet machine is still better.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
import time
import uuid
from typing import Any

from agent.runtimes.base import RunSpec
from agent.runtimes.process import ProcessRuntime
from libs.logging import configure


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def measure(runs: int, command: str, memory_mb: int, **options: Any) -> tuple[float, float]:
    """(CPU ms per run, wall ms per run)."""
    with tempfile.TemporaryDirectory(prefix="hf-supervisor-cpu-") as state:
        rt = ProcessRuntime(state, poll_s=0.005, **options)
        cpu0, t0 = _children_cpu(), time.monotonic()
        for _ in range(runs):
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
        cpu, wall = _children_cpu() - cpu0, time.monotonic() - t0
    return cpu / runs * 1000, wall / runs * 1000


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.supervisor_cpu", description=__doc__)
    p.add_argument("--runs", type=int, default=40, help="tasks per measurement (default 40)")
    p.add_argument("--repeat", type=int, default=3, help="measurements (default 3)")
    p.add_argument("--command", default="true", help="the job (default: true)")
    p.add_argument("--memory-mb", type=int, default=2048, help="as a task's default (2048)")
    p.add_argument(
        "--no-setpriv",
        action="store_true",
        help="the fallback without util-linux setpriv (no_new_privs through ctypes)",
    )
    args = p.parse_args()
    configure("warning")  # not a line per task
    options = {"setpriv": False} if args.no_setpriv else {}
    for _ in range(args.repeat):
        cpu, wall = asyncio.run(measure(args.runs, args.command, args.memory_mb, **options))
        print(f"{args.runs} runs of {args.command!r}: {cpu:.1f} ms CPU, {wall:.1f} ms wall each")


if __name__ == "__main__":
    main()
