"""`python -m bench peer`: HeteroFlow beside Slurm on the same machine (docs/benchmarks.md).

Each run starts a fresh single-node Slurm (bench/peer/slurm-setup.sh: 64 CPUs declared,
backfill, state under a temporary directory) and a fresh `heteroflow up` (process runtime,
64 CPUs declared, embedded servers under a temporary home), one after the other, never both
at once, the order alternating from run to run; each runs the same workloads
(workloads.py) and is stopped before the other starts. The table (table.py) gives every
run's figure, the medians, their ratio and the issue's target. Without Slurm (or when not
root) it says so and runs HeteroFlow alone.

Not one of the suites of `python -m bench`: it brings its own servers and takes minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import psutil

from ..report import environment
from .systems import HeteroFlow, Slurm, System, slurm_missing
from .table import render
from .workloads import Results, Sizes, measure

DESCRIPTION = "HeteroFlow beside a single-node Slurm: burst, steady rate, wide start, CPU/job"


def build_parser() -> argparse.ArgumentParser:
    d = Sizes()
    p = argparse.ArgumentParser(prog="python -m bench peer", description=DESCRIPTION)
    p.add_argument("--runs", type=int, default=3, help="runs per system (default 3)")
    p.add_argument("--burst", type=int, default=d.burst, help=f"burst jobs (default {d.burst})")
    p.add_argument("--rate", type=float, default=d.rate, help=f"steady jobs/s (default {d.rate:g})")
    p.add_argument(
        "--steady-s", type=float, default=d.steady_s, help=f"steady seconds ({d.steady_s:g})"
    )
    p.add_argument("--wide", type=int, default=d.wide, help=f"wide-start jobs ({d.wide})")
    p.add_argument(
        "--wide-sleep", type=float, default=d.wide_sleep, help=f"their sleep, s ({d.wide_sleep:g})"
    )
    p.add_argument(
        "--concurrency", type=int, default=d.concurrency, help="submissions in flight (16)"
    )
    p.add_argument("--only", choices=("slurm", "heteroflow"), help="run one system only")
    p.add_argument("--keep", action="store_true", help="keep each run's directory (logs)")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write every figure as JSON")
    return p


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def systems_to_run(only: str | None) -> tuple[list[str], str]:
    """The systems of each run, and a sentence when Slurm cannot run here."""
    if only == "heteroflow":
        return ["HeteroFlow"], ""
    missing = slurm_missing()
    why = ""
    if missing:
        why = f"Slurm is not installed ({', '.join(missing)} not found)"
    elif os.geteuid() != 0:
        why = "Slurm needs root here (slurmd starts jobs as their user)"
    if why:
        if only == "slurm":
            raise SystemExit(f"{why}: apt-get install -y slurm-wlm munge, as root")
        _say(f"{why}; running HeteroFlow alone (apt-get install -y slurm-wlm munge, as root)")
        return ["HeteroFlow"], why
    return (["Slurm"] if only == "slurm" else ["Slurm", "HeteroFlow"]), ""


def make(name: str, root: Path) -> System:
    return Slurm(root) if name == "Slurm" else HeteroFlow(root)


async def one_run(name: str, sizes: Sizes, keep: bool) -> tuple[Results, list[str]]:
    root = Path(tempfile.mkdtemp(prefix=f"hf-peer-{name.lower()}-"))
    system = make(name, root / "system")
    try:
        try:
            await system.start()
        except Exception as e:  # noqa: BLE001 - reported, the other runs go on
            return {}, [f"did not start: {e}"]
        try:
            return await measure(system, sizes, root / "started")
        finally:
            await system.stop()
    finally:
        if keep:
            _say(f"{name}: kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


async def run_all(
    names: Sequence[str], sizes: Sizes, runs: int, keep: bool
) -> tuple[dict[str, list[Results]], list[str]]:
    results: dict[str, list[Results]] = {n: [] for n in names}
    notes: list[str] = []
    for i in range(runs):
        # Alternate who goes first, so a drift of the machine favours neither.
        order = list(names) if i % 2 == 0 else list(reversed(names))
        for name in order:
            _say(f"run {i + 1}/{runs}: {name} …")
            figures, said = await one_run(name, sizes, keep)
            results[name].append(figures)
            notes += [f"run {i + 1} {name}: {n}" for n in said]
            _say(f"run {i + 1}/{runs}: {name}: {figures}")
    return results, notes


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sizes = Sizes(
        burst=args.burst,
        rate=args.rate,
        steady_s=args.steady_s,
        wide=args.wide,
        wide_sleep=args.wide_sleep,
        concurrency=args.concurrency,
    )
    names, why = systems_to_run(args.only)
    env = environment()
    busy = psutil.cpu_percent(interval=0.5)
    results, notes = asyncio.run(run_all(names, sizes, args.runs, args.keep))
    print(f"{env['date']}, {env['cpus']} CPUs, {busy:.0f}% busy before the run, {env['command']}")
    if why:
        print(f"{why}: HeteroFlow alone.")
    print()
    print(render(results, sizes))
    if notes:
        print()
        print("\n".join(f"* {n}" for n in notes))
    if args.json:
        doc = {**env, "cpu_busy_percent_before": busy, "sizes": asdict(sizes), "runs": results}
        args.json.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return 0
