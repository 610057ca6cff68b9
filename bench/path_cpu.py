"""The bench process's CPU per task on the scheduler path at one fixed rate (issue 32).

    python -m bench.path_cpu [--rate 150] [--seconds 10] [--repeat 2]

The end-to-end path of `python -m bench scheduler` (outbox relay and scheduler service in this
process, the simulated 1,000-node fleet a child process), after its short steady and node-loss
runs: `--repeat` times, every running task is finished, then tasks are created at `--rate`
for `--seconds` and waited for. Prints, per repetition, this process's CPU per submitted task
(control plane and load generator, with the fixed costs of those seconds) and the submit →
running p50 and p99. It uses the suite's public pieces only, so it runs against an older tree
too (`PYTHONPATH=OLD python bench/path_cpu.py`) for a before/after on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time

from bench import fresh_database, servers
from bench import scheduler_path as sp
from bench.scheduler_place import STEADY_SPEC, TENANT
from bench.scheduler_steps import nearest_rank
from libs import collector
from libs.logging import configure
from libs.store.eventstore import EventStore


async def _run(url: str, nats_url: str, rate: float, seconds: float, repeat: int) -> list[str]:
    out: list[str] = []

    async def then(store: EventStore, fleet: sp.FleetProcess) -> None:
        for _ in range(repeat):
            await fleet.call({"op": "finish"})
            with contextlib.suppress(TimeoutError):
                await sp._until(sp.none_running(store), sp.SETTLE_TIMEOUT_S)
            cpu = time.process_time()
            run = await sp.steady_load(store, STEADY_SPEC, TENANT, rate, seconds, settle_s=5)
            cpu = time.process_time() - cpu
            n = len(run.submitted)
            p50, p99 = (nearest_rank(run.latencies, q) * 1000 for q in (50, 99))
            out.append(
                f"{rate:g} tasks/s: {n} tasks, CPU {cpu / n * 1000:.2f} ms/task, "
                f"p50 {p50:.0f} ms, p99 {p99:.0f} ms, {len(run.latencies)} running"
            )

    await sp.run_path(
        url,
        nats_url,
        nodes=1_000,
        rate=50,
        duration=2,
        offline_after=3,
        spec=STEADY_SPEC,
        tenant=TENANT,
        then=then,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=150.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    configure("warning", "json")
    collector.tune(collector.SERVICE_DEFAULT)
    with servers() as srv, fresh_database(srv.database_url) as url:
        lines = asyncio.run(_run(url, srv.nats_url, args.rate, args.seconds, args.repeat))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
