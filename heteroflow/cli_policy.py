"""`heteroflow policy replay`: the recorded history re-run under a changed policy.

Reads the whole event log (one snapshot, libs/store/history.py), replays the window
`--since` ago to the last event through the placement core with the `--set` overrides
(services/scheduler/replay/), and prints, per tenant and queue, the recorded figures beside
the replayed ones. Needs the database: HETEROFLOW_DATABASE_URL, or the embedded one under
HETEROFLOW_HOME. Exit 0, or 2 for a setting it does not know.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from contextlib import aclosing
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported when the command runs: `heteroflow --help` stays quick
    from libs.store.eventstore import EventStore
    from services.scheduler.replay.report import Report

LogRow = tuple[str, str, int, str, str, datetime]
_SPAN = re.compile(r"^(\d+)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}


def parse_since(text: str) -> timedelta | datetime:
    """`7d`, `36h`, `90m` (a span before the last event) or an RFC 3339 time."""
    from services.scheduler.replay import PolicyError

    m = _SPAN.match(text.strip())
    if m:
        return timedelta(seconds=int(m.group(1)) * _UNIT_S[m.group(2)])
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise PolicyError(f"--since takes a span (7d, 36h, 90m) or an RFC 3339 time (got {text!r})")
    return at


async def read_log(store: EventStore) -> list[LogRow]:
    """Every event, in log order, as the replay reads them."""
    from libs.store import history

    rows: list[LogRow] = []
    async with aclosing(history.log_pages(store)) as pages:
        async for page in pages:
            rows.extend(
                (e.stream_type, e.stream_id, e.version, e.type, e.payload, e.occurred_at)
                for e in page
            )
    return rows


def report_of(rows: list[LogRow], sets: list[str], since: str | None) -> Report:
    """The report of `rows` under the `--set` settings over the `--since` window."""
    from services.scheduler.replay import PolicyError, parse_sets, record, report_for, unknown_names

    policy = parse_sets(sets)
    start: datetime | None = None
    if since and rows:
        window = parse_since(since)
        last = max(r[5] for r in rows)
        start = last - window if isinstance(window, timedelta) else window
    rec = record(rows, start)
    groups = {n for g in rec.autoscale.groups.values() for n in (g.group_id, g.name)}
    unknown = unknown_names(policy, rec.tenants, rec.queue_names, groups)
    if unknown:
        raise PolicyError(f"not in the log: {', '.join(unknown)}")
    return report_for(rec, policy)


async def _run(args: argparse.Namespace) -> int:
    from heteroflow.cli_ops import _database_url
    from libs.config import CommonSettings
    from libs.store.eventstore import EventStore
    from services.scheduler.replay import parse_sets

    parse_sets(args.set or [])  # refuse a bad setting before reading the log
    store = await EventStore.open(_database_url(CommonSettings()), max_size=2)
    try:
        rows = await read_log(store)
    finally:
        await store.close()
    if not rows:
        print("the event log is empty: nothing to replay", file=sys.stderr)
        return 1
    report = report_of(rows, args.set or [], args.since)
    sys.stdout.write(report.json() + "\n" if args.json else report.text())
    return 0


def _main(args: argparse.Namespace) -> int:
    from libs.logging import configure
    from services.scheduler.replay import PolicyError

    configure("warning", "json")  # logs to stderr; standard output carries the report
    try:
        return asyncio.run(_run(args))
    except PolicyError as exc:
        print(f"heteroflow policy replay: {exc}", file=sys.stderr)
        return 2


def register_policy_commands(sub: Any) -> None:
    """`heteroflow policy replay [--since 7d] [--set KEY=VALUE ...] [--json]`."""
    policy = sub.add_parser("policy", help="test a scheduling policy against recorded history")
    what = policy.add_subparsers(dest="policy_command", required=True)
    p = what.add_parser(
        "replay",
        help="re-run the log's submissions and node events under changed settings; compare",
    )
    p.add_argument(
        "--since",
        metavar="SPAN|TIME",
        help="the window: a span before the last event (7d, 36h, 90m) or an RFC 3339 time"
        " (default: the whole log)",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="repeatable: quota.<tenant>.max_gpus=N, queue.<name>.max_gpus|max_running_jobs|"
        "max_running_tasks|priority=N, queue.<name>.policy=fifo|priority, preemption=on|off,"
        " autoscaler.<group>.target|min_replicas|max_replicas|cooldown_up_s|cooldown_down_s=N",
    )
    p.add_argument("--json", action="store_true", help="one JSON document on standard output")
    p.set_defaults(func=_main)
