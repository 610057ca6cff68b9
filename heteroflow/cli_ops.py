"""Operator commands over the store itself:
`heteroflow events replay|tail|export|republish|dead-letters`.

They need the database (HETEROFLOW_DATABASE_URL, or the embedded one under HETEROFLOW_HOME)
and, for `republish`, NATS (HETEROFLOW_NATS_URL or the embedded one's URL).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import datetime

from libs.config import CommonSettings
from libs.store.types import EventRange


def _database_url(settings: CommonSettings) -> str:
    if settings.database_url:
        return settings.database_url.get_secret_value()
    from libs.embedded import EmbeddedPostgres

    pgdata = settings.home / "postgres"
    if not pgdata.exists():
        raise SystemExit(
            f"no database: set HETEROFLOW_DATABASE_URL or run `heteroflow up` "
            f"(nothing under {pgdata})"
        )
    # Attach: with `heteroflow up` running, use its server and leave it running.
    return EmbeddedPostgres(pgdata, attach=True).start().url


def _nats_url(settings: CommonSettings) -> str:
    if settings.nats_url:
        return settings.nats_url.get_secret_value()
    from libs.embedded import EmbeddedNats

    root = settings.home / "nats"
    port_file = root / "port"
    if not port_file.exists():
        raise SystemExit("no NATS: set HETEROFLOW_NATS_URL or run `heteroflow up`")
    return EmbeddedNats(root, port=int(port_file.read_text())).url


def _range(args: argparse.Namespace) -> EventRange:
    start = getattr(args, "start", None)
    to = getattr(args, "to", None)
    return EventRange(
        from_position=int(start) if start and start.isdigit() else None,
        from_time=datetime.fromisoformat(start) if start and not start.isdigit() else None,
        to_position=int(to) if to else None,
        streams=tuple(getattr(args, "stream", None) or ()),
    )


async def _replay(args: argparse.Namespace) -> int:
    from libs.store.eventstore import EventStore
    from libs.store.replay import rebuild

    store = await EventStore.open(_database_url(CommonSettings()))
    try:
        report = await rebuild(store, dry_run=args.dry_run)
    finally:
        await store.close()
    diff_rows = sum(len(v) for v in report.differences.values())
    print(
        json.dumps(
            {
                "events": report.events,
                "seconds": round(report.seconds, 3),
                "events_per_second": round(report.events_per_second),
                "differences": report.differences,
                "timeline_unsourced": report.timeline_unsourced,
                "dry_run": args.dry_run,
            },
            indent=2,
        )
    )
    print(
        f"replayed {report.events} events in {report.seconds:.2f}s "
        f"({report.events_per_second:,.0f} events/s); {diff_rows} row(s) differed"
        f" ({report.timeline_unsourced} timeline entries with no committed source event)",
        file=sys.stderr,
    )
    return 1 if diff_rows else 0


async def _export(args: argparse.Namespace, follow: bool) -> int:
    from libs.store.eventstore import EventStore

    where = _range(args)
    out = open(args.output, "w") if getattr(args, "output", None) else sys.stdout  # noqa: SIM115, ASYNC230
    after = 0
    store = await EventStore.open(_database_url(CommonSettings()), max_size=1)
    try:
        while True:
            events = await store.read_range(where, after, 5000)
            for ev in events:
                out.write(json.dumps(ev.as_json()) + "\n")
            out.flush()
            if events:
                after = events[-1].position
            elif not follow:
                break
            else:
                await asyncio.sleep(0.5)
    finally:
        await store.close()
    if out is not sys.stdout:
        out.close()
    return 0


async def _republish(args: argparse.Namespace) -> int:
    """Publish a range again. Safe: the message id is the event id, so JetStream drops what
    it still holds (2-minute window) and consumers are idempotent for the rest."""
    from libs.bus.nats import connect, ensure_streams
    from libs.store.eventstore import EventStore
    from libs.store.relay import envelope_of, headers_of, subject_of

    settings = CommonSettings()
    where = _range(args)
    nc = await connect(_nats_url(settings), "events-republish")
    js = nc.jetstream()
    await ensure_streams(js)
    sent = 0
    store = await EventStore.open(_database_url(settings), max_size=1)
    try:
        after = 0
        while events := await store.read_range(where, after, 1000):
            for ev in events:
                await js.publish(subject_of(ev), envelope_of(ev), headers=headers_of(ev))
                sent += 1
            after = events[-1].position
    finally:
        await store.close()
    await nc.close()
    print(f"republished {sent} event(s)", file=sys.stderr)
    return 0


async def _dead_letters(args: argparse.Namespace) -> int:
    """Events the relay could not publish, newest first, as JSON lines (one per event);
    with --consumers, the messages consumers gave up on (HF_DLQ) instead."""
    if args.consumers:
        return await _consumer_dead_letters(args.limit)
    from libs.store.dead_letters import list_dead_letters
    from libs.store.eventstore import EventStore

    store = await EventStore.open(_database_url(CommonSettings()), max_size=1)
    try:
        letters = await list_dead_letters(store, args.limit)
    finally:
        await store.close()
    for letter in letters:
        print(json.dumps(letter.as_dict(), default=str))
    print(f"{len(letters)} dead-lettered event(s)", file=sys.stderr)
    return 0


async def _consumer_dead_letters(limit: int) -> int:
    from libs.bus.dead_letters import read_dead_letters
    from libs.bus.nats import connect

    nc = await connect(_nats_url(CommonSettings()), "events-dead-letters", give_up_after=10)
    try:
        letters = await read_dead_letters(nc.jetstream(), limit)
    finally:
        await nc.close()
    for letter in letters:
        print(json.dumps(letter))
    print(f"{len(letters)} dead-lettered message(s) in HF_DLQ", file=sys.stderr)
    return 0


OPS = ("replay", "tail", "export", "republish", "dead-letters")


def build_ops_parser() -> argparse.ArgumentParser:
    """`heteroflow events replay|tail|export|republish|dead-letters` (`heteroflow events
    TASK_ID` is the user command showing a task's timeline)."""
    parser = argparse.ArgumentParser(
        prog="heteroflow events", description="operate on the event store"
    )
    ops = parser.add_subparsers(dest="events_command", required=True)
    replay = ops.add_parser("replay", help="rebuild projections from the store; report diffs")
    replay.add_argument("--dry-run", action="store_true", help="compare, then roll back")
    replay.set_defaults(func=lambda a: asyncio.run(_replay(a)))
    for name, follow, help_ in (
        ("tail", True, "follow the store from a position or time"),
        ("export", False, "write events as JSON lines"),
    ):
        p = ops.add_parser(name, help=help_)
        p.add_argument("--from", dest="start", help="position (integer) or ISO time")
        p.add_argument("--stream", action="append", help="stream id (repeatable)")
        if not follow:
            p.add_argument("--to", help="last position")
            p.add_argument("--output", "-O", help="file (default: standard output)")
        p.set_defaults(func=lambda a, f=follow: asyncio.run(_export(a, f)))
    rep = ops.add_parser("republish", help="publish a range to JetStream again (dedup-safe)")
    rep.add_argument("--from", dest="start", help="position or ISO time")
    rep.add_argument("--to", help="last position")
    rep.add_argument("--stream", action="append")
    rep.set_defaults(func=lambda a: asyncio.run(_republish(a)))
    dead = ops.add_parser("dead-letters", help="events the relay could not publish (newest first)")
    dead.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    dead.add_argument(
        "--consumers",
        action="store_true",
        help="messages consumers gave up on after max_deliver (stream HF_DLQ), from NATS",
    )
    dead.set_defaults(func=lambda a: asyncio.run(_dead_letters(a)))
    return parser
