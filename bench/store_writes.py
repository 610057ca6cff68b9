"""CPU per write of the store's one-statement path against the statement-per-row shape it
replaced (issue 32), interleaved in one process so both sides see the same machine.

    python -m bench.store_writes [--rounds 6]

"one statement": the code as it is (`EventStore._append_tasks`: the events' insert a CTE of
the projection's upsert, one jsonb parameter each; a create in autocommit). "per row": the
same commands with the events inserted by `executemany` of the one-row INSERT, the
projection rows by `executemany` of the one-row upsert, and a create in a pipelined
transaction, as the store wrote them before 2026-12-03. Each round runs both sides, in an
order that alternates, over: 100 single creates, `execute_batch` of 1 (64 of them), of 32
and of 256 (512 commands each), and 64 single `execute` commands; each command changes a
task's pending reason. Prints the median CPU (this process, `time.process_time`) per
command over the rounds, with the spread.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from bench import fresh_database, servers
from libs import collector
from libs.domain.reasons import ReasonCode
from libs.domain.task import decide as commands
from libs.domain.task.model import Task, TaskSpec, TenantId
from libs.logging import configure
from libs.store import eventstore as es
from libs.store import projections
from libs.store.eventstore import EventRows, EventStore, NewTask, _count, _new_tasks

SPEC = TaskSpec(name="bench", image="sim:latest", gpu_required=1, labels={"team": "a"})
TENANT = TenantId("default")
ONE_STATEMENT = (EventStore._append_tasks, EventStore.create_tasks)


async def _per_row_append(
    self: EventStore, conn: AsyncConnection[Any], rows: EventRows, tasks: Iterable[Task]
) -> None:
    async with conn.cursor() as cur:
        if len(rows.params) == 1:
            await cur.execute(es.INSERT_EVENT_NO_RETURN, rows.params[0])
        else:
            await cur.executemany(es.INSERT_EVENT_NO_RETURN, rows.params)
        await cur.executemany(projections.UPSERT_TASK, [projections.task_row(t) for t in tasks])
    _count(rows.params)


async def _per_row_create(
    self: EventStore,
    items: list[NewTask],
    *,
    metadata: dict[str, Any] | None = None,
    generation: int = 0,
) -> list[Task]:
    async with self.pool.connection() as conn, conn.pipeline(), conn.transaction():
        rows = EventRows(self.clock())
        tasks = _new_tasks(rows, items, Jsonb(metadata or {}), generation)
        await _per_row_append(self, conn, rows, tasks)
    return tasks


def _use(per_row: bool) -> None:
    append, create = (_per_row_append, _per_row_create) if per_row else ONE_STATEMENT
    EventStore._append_tasks = append  # type: ignore[method-assign]
    EventStore.create_tasks = create  # type: ignore[method-assign,assignment]


def _why(i: int) -> Callable[[Task], list[Any]]:
    def decide(t: Task) -> list[Any]:
        return list(commands.decide_pending_reason(t, ReasonCode.INSUFFICIENT_GPUS, f"r{i}"))

    return decide


async def _run(url: str, rounds: int) -> dict[tuple[str, str], list[float]]:
    store = await EventStore.open(url, max_size=4)
    out: dict[tuple[str, str], list[float]] = {}

    def add(what: str, side: str, cpu: float, n: int) -> None:
        out.setdefault((what, side), []).append(cpu / n * 1e6)

    try:
        ids = [t.id for t in await store.create_tasks([(TENANT, SPEC, None, None)] * 512)]
        n = 0
        for r in range(rounds):
            for per_row in (True, False, False, True) if r % 2 else (False, True, True, False):
                _use(per_row)
                side = "per row" if per_row else "one statement"
                cpu = time.process_time()
                for _ in range(100):
                    await store.create_task(TENANT, SPEC)
                add("create_task", side, time.process_time() - cpu, 100)
                for size, count in ((1, 64), (32, 512), (256, 512)):
                    cpu = time.process_time()
                    for start in range(0, count, size):
                        n += 1
                        await store.execute_batch({i: _why(n) for i in ids[start : start + size]})
                    add(f"execute_batch of {size}", side, time.process_time() - cpu, count)
                cpu = time.process_time()
                for _ in range(64):
                    n += 1
                    await store.execute(ids[n % len(ids)], _why(n))
                add("execute", side, time.process_time() - cpu, 64)
    finally:
        _use(False)
        await store.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    configure("warning", "json")
    collector.tune(collector.SERVICE_DEFAULT)
    with servers() as srv, fresh_database(srv.database_url) as url:
        found = asyncio.run(_run(url, args.rounds))
    print(f"{'write':22s} {'side':14s} {'CPU us/command':>15s}  spread")
    for (what, side), values in sorted(found.items()):
        print(
            f"{what:22s} {side:14s} {statistics.median(values):15,.0f}  "
            f"{min(values):,.0f}-{max(values):,.0f} (n {len(values)})"
        )


if __name__ == "__main__":
    main()
