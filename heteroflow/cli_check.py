"""`heteroflow check history`: read the whole event log and prove its invariants.

The invariants are libs/domain/invariants.py (whitelisted transitions, one node per task, no
card over-committed, terminal states final, gapless streams that start with their creation);
the timeline is checked against the log by a store query (libs/store/timeline.py). Exit 0
when the history is clean, 1 with violations (each printed with the events that show it).
Needs the database: HETEROFLOW_DATABASE_URL, or the embedded one under HETEROFLOW_HOME.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libs.config import CommonSettings
from libs.domain.invariants import HistoryChecker, Invariant, unsourced_timeline
from libs.store import history, timeline
from libs.store.eventstore import EventStore


@dataclass(frozen=True)
class HistoryResult:
    checker: HistoryChecker
    seconds: float

    def view(self) -> dict[str, Any]:
        c = self.checker
        return {
            "clean": c.clean,
            "events": c.events,
            "seconds": round(self.seconds, 3),
            "events_per_second": round(c.events / self.seconds) if self.seconds else None,
            "violations": sum(c.counts.values()),
            "by_invariant": {k.value: v for k, v in sorted(c.counts.items())},
            "listed": [v.view() for v in c.violations],
            "truncated": sum(c.counts.values()) > len(c.violations),
        }


async def check_history(
    store: EventStore, acknowledged: Sequence[str] = (), max_reported: int = 1000
) -> HistoryResult:
    """Every invariant over the store's log and timeline; `acknowledged`: task ids clients
    were told were created (each must have its `task_created`)."""
    checker = HistoryChecker(max_reported)
    started = time.perf_counter()
    async with aclosing(history.log_pages(store)) as pages:  # the cursor closes on error too
        async for page in pages:
            checker.feed_all(page)
    checker.expect_created(acknowledged)
    entries, total = await timeline.unsourced(store, max_reported)
    for e in entries:
        why = (
            f"its source event {e.source_event} is not in the log"
            if e.event_occurred_at is None
            else f"it says {e.occurred_at.isoformat()}, its source event "
            f"{e.source_event} {e.event_occurred_at.isoformat()}"
        )
        checker.report(unsourced_timeline(e.id, f"{e.subject_type} {e.subject_id}", e.kind, why))
    if total > len(entries):  # counted, not listed
        checker.counts[Invariant.TIMELINE_UNSOURCED] += total - len(entries)
    return HistoryResult(checker, time.perf_counter() - started)


def _print_text(result: HistoryResult) -> None:
    c = result.checker
    for v in c.violations:
        print(f"{v.invariant.value}: {v.message}")
        for ref in v.events:
            print(f"    {ref.line()}")
    found = sum(c.counts.values())
    rate = f" ({c.events / result.seconds:,.0f} events/s)" if result.seconds else ""
    verdict = "clean" if c.clean else f"{found} violation(s)"
    if found > len(c.violations):
        verdict += f", the first {len(c.violations)} listed"
    by = ", ".join(f"{k.value} {n}" for k, n in sorted(c.counts.items()))
    print(
        f"history: {c.events:,} events checked in {result.seconds:.2f} s{rate}: {verdict}"
        + (f" ({by})" if by else "")
    )


async def _run(args: argparse.Namespace, acknowledged: list[str]) -> int:
    from heteroflow.cli_ops import _database_url

    store = await EventStore.open(_database_url(CommonSettings()), max_size=2)
    try:
        result = await check_history(store, acknowledged, args.max_listed)
    finally:
        await store.close()
    if args.json:
        print(json.dumps(result.view(), indent=2))
    else:
        _print_text(result)
    return 0 if result.checker.clean else 1


def register_check_commands(sub: Any) -> None:
    """`heteroflow check history [--json] [--acknowledged FILE] [--max-listed N]`."""
    check = sub.add_parser("check", help="prove invariants of the platform's records")
    what = check.add_subparsers(dest="check_command", required=True)
    p = what.add_parser(
        "history",
        help="read the event log; report every broken invariant with its events (exit 1)",
    )
    p.add_argument("--json", action="store_true", help="one JSON document on standard output")
    p.add_argument(
        "--acknowledged",
        metavar="FILE",
        help="task ids (one a line) that got a 201: each must have its creation in the log",
    )
    p.add_argument(
        "--max-listed",
        type=int,
        default=1000,
        metavar="N",
        help="list at most N violations (all are counted; default 1000)",
    )
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from libs.logging import configure

    configure("warning", "json")  # logs to stderr; standard output carries the result
    acknowledged: list[str] = []
    if args.acknowledged:
        text = Path(args.acknowledged).read_text()
        acknowledged = [line.strip() for line in text.splitlines() if line.strip()]
    return asyncio.run(_run(args, acknowledged))
