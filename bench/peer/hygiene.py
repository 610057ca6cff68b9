"""`python -m bench.peer.hygiene`: many trivial tasks through one agent, and what they leave.

Starts `heteroflow up --runtime process --cpus 64` as the peer benchmark does (systems.py,
fresh home under a temporary directory), creates `--tasks` tasks running `true` (at most
`--concurrency` creates in flight; a 429 or 503 is waited out and sent again), and while
they run samples every `--sample-s` the zombies under `up` (processes in state Z anywhere in
its tree) and the task directories in the agent's state. When every task has ended it waits
`--settle-s` at most for the last ones to be reaped and pruned, then prints the targets of
docs/benchmarks.md "Hygiene": zero zombies afterwards, task directories at most the
retention setting (`HETEROFLOW_FINISHED_KEEP`, default 100). Exit status 1 when a target
is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from .systems import HeteroFlow
from .workloads import Sizes, drained, submit_all

DEFAULT_KEEP = 100  # agent/settings.py finished_keep


@dataclass
class Sample:
    zombies: int
    task_dirs: int


def zombies_under(pid: int) -> int:
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return 0
    count = 0
    for kid in kids:
        try:
            count += kid.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            continue  # gone between listing and reading
    return count


def task_dirs(home: Path) -> int:
    return sum(1 for _ in home.glob("agents/*/tasks/*"))


def sample(system: HeteroFlow) -> Sample:
    assert system.proc is not None
    return Sample(zombies_under(system.proc.pid), task_dirs(system.home))


async def watch(system: HeteroFlow, every_s: float, seen: list[Sample]) -> None:
    while True:
        seen.append(await asyncio.to_thread(sample, system))
        await asyncio.sleep(every_s)


async def run(args: argparse.Namespace, root: Path) -> bool:
    system = HeteroFlow(root)
    sizes = Sizes(concurrency=args.concurrency, timeout_s=args.timeout_s)
    seen: list[Sample] = []
    await system.start()
    try:
        started = time.monotonic()
        watcher = asyncio.create_task(watch(system, args.sample_s, seen))
        await submit_all(system, ["true"] * args.tasks, sizes.concurrency)
        await drained(system, sizes)
        elapsed = time.monotonic() - started
        deadline = time.monotonic() + args.settle_s
        after = sample(system)
        while (after.zombies or after.task_dirs > args.keep) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            after = sample(system)
        watcher.cancel()
    finally:
        await system.stop()
    zombie_ok, dirs_ok = after.zombies == 0, after.task_dirs <= args.keep
    print(
        f"{args.tasks} tasks of `true` through one agent in {elapsed:.1f} s "
        f"({args.tasks / elapsed:.1f}/s; {system.throttled} creates waited out a 429/503)"
    )
    print(
        f"while running ({len(seen)} samples every {args.sample_s:g} s): zombies at most "
        f"{max((s.zombies for s in seen), default=0)}, task directories at most "
        f"{max((s.task_dirs for s in seen), default=0)}"
    )
    print(
        f"afterwards: zombies {after.zombies} (target 0: {'met' if zombie_ok else 'MISSED'}), "
        f"task directories {after.task_dirs} (target <= {args.keep}: "
        f"{'met' if dirs_ok else 'MISSED'})"
    )
    return zombie_ok and dirs_ok


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.peer.hygiene", description=__doc__)
    p.add_argument("--tasks", type=int, default=10_000, help="trivial tasks (default 10000)")
    p.add_argument("--concurrency", type=int, default=16, help="creates in flight (16)")
    p.add_argument("--keep", type=int, default=DEFAULT_KEEP, help="the retention setting (100)")
    p.add_argument("--sample-s", type=float, default=1.0, help="sampling period (1 s)")
    p.add_argument("--settle-s", type=float, default=10.0, help="wait after the end (10 s)")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="for the whole run")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hf-hygiene-") as root:
        ok = asyncio.run(run(args, Path(root)))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
