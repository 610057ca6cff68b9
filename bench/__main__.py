"""`python -m bench [suite ...] [--json PATH]`: measure the floors, run the suites, print a table.

With no suite named, every suite that exists runs. Floors are measured once per run, before
the suites, on the same servers.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from libs import collector
from libs.config import CommonSettings
from libs.logging import configure

from . import Context, Servers, available_suites, fresh_database, servers
from .floors import measure
from .report import Row, environment, format_table, write_json

IDLE_BUSY_PERCENT = 20.0


def build_parser(suites: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="HeteroFlow benchmarks against floors measured in the same run.",
        epilog="suites: " + ", ".join(suites) + "; also `python -m bench peer --help`",
    )
    parser.add_argument("suites", nargs="*", metavar="SUITE", help="suites to run (default: all)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write results as JSON")
    parser.add_argument("--list", action="store_true", help="list the suites and exit")
    for name in suites:
        importlib.import_module(f"bench.{name}").add_arguments(parser)
    return parser


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _check_idle() -> float:
    """CPU busy percent over half a second; a warning when other work competes for the CPUs.

    (Not the load average: processes frozen in uninterruptible sleep, such as paused
    containers, raise it without using any CPU.)
    """
    busy = float(psutil.cpu_percent(interval=0.5))
    if busy > IDLE_BUSY_PERCENT:
        _progress(
            f"warning: the CPUs are {busy:.0f}% busy before the run: other processes compete "
            "with the servers and the numbers will be low"
        )
    return busy


async def run_suites(
    srv: Servers, names: list[str], args: argparse.Namespace
) -> tuple[dict[str, list[Row]], dict[str, float]]:
    results: dict[str, list[Row]] = {}
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    with fresh_database(srv.database_url) as url:
        floors = await measure(url, srv.nats_url)
    seconds["floors"] = time.perf_counter() - start
    results["floors"] = floors.rows()
    _progress(f"floors: {seconds['floors']:.1f} s")
    ctx = Context(srv, floors, args)
    for name in names:
        start = time.perf_counter()
        results[name] = await importlib.import_module(f"bench.{name}").run(ctx)
        seconds[name] = time.perf_counter() - start
        _progress(f"{name}: {seconds[name]:.1f} s")
    return results, seconds


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    if raw[:1] == ["peer"]:  # brings its own servers (and Slurm): not one of the suites
        from .peer import main as peer_main

        return peer_main(raw[1:])
    if raw[:1] == ["serve-peer"]:  # brings its own servers (and Ray): not one of the suites
        from .serve_peer import main as serve_peer_main

        return serve_peer_main(raw[1:])
    available = available_suites()
    parser = build_parser(available)
    args = parser.parse_args(argv)
    if args.list:
        for name in available:
            print(f"{name:12} {importlib.import_module(f'bench.{name}').DESCRIPTION}")
        return 0
    unknown = [n for n in args.suites if n not in available]
    if unknown:
        parser.error(f"unknown suite(s): {', '.join(unknown)} (have: {', '.join(available)})")
    names = list(dict.fromkeys(args.suites)) or available
    configure("warning", "json")
    # The control plane the suites run in this process is set as a deployed service's is.
    gc_threshold = CommonSettings().gc_threshold
    collector.tune(gc_threshold)
    started = time.perf_counter()
    env = environment()
    busy_before = _check_idle()
    with servers() as srv:
        _progress("servers: " + ("embedded" if srv.embedded else "external"))
        results, seconds = asyncio.run(run_suites(srv, names, args))
    print(format_table([row for rows in results.values() for row in rows]))
    if args.json:
        meta: dict[str, Any] = {
            **env,
            "embedded_servers": srv.embedded,
            "gc_threshold": gc_threshold,
            "options": {k: v for k, v in vars(args).items() if k not in ("json", "list")},
            "seconds": {**seconds, "total": time.perf_counter() - started},
            "cpu_busy_percent_before": busy_before,
            "loadavg_1m_after": os.getloadavg()[0],
        }
        write_json(args.json, results, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
