"""History-check suite: `heteroflow check history` over a store of ≥100k events.

The store is seeded by the replay suite's generator (TaskCreated + four transitions per task,
written with COPY) and checked once, timed from the first page read to the timeline query.
A seeded history is clean, so the check must report zero violations. The seeded tasks carry
no card ids, so the per-card accounting is not part of this number (it is per placement, not
per event).
"""

from __future__ import annotations

import argparse

from heteroflow.cli_check import check_history
from libs.store.eventstore import EventStore

from . import Context
from .replay import seed
from .report import Row

DESCRIPTION = "prove the event log's invariants over ≥100k events; events/s and violations"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("history")
    group.add_argument(
        "--history-tasks",
        type=int,
        default=20_000,
        help="tasks to seed, five events each (default 20000 → 100k events)",
    )


async def run(ctx: Context) -> list[Row]:
    with ctx.database() as url:
        store = await EventStore.open(url, max_size=2)  # runs migrations
        try:
            seeded = seed(url, ctx.args.history_tasks)
            result = await check_history(store)
        finally:
            await store.close()
    checker = result.checker
    return [
        Row("history.events", float(checker.events), "events", note=f"{seeded} seeded"),
        Row("history.seconds", result.seconds, "s", note="read, parse and check every event"),
        Row("history.rate", checker.events / result.seconds, "events/s"),
        Row("history.violations", float(sum(checker.counts.values())), "", note="must be 0"),
    ]
