"""Operator commands over the store itself: `heteroflow events replay|tail|export|republish`.

They need the database (HETEROFLOW_DATABASE_URL, or the embedded one under HETEROFLOW_HOME)
and, for `republish`, NATS (HETEROFLOW_NATS_URL or the embedded one's URL).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import datetime
from typing import Any

from libs.config import CommonSettings


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
    return EmbeddedPostgres(pgdata).start().url


def _nats_url(settings: CommonSettings) -> str:
    if settings.nats_url:
        return settings.nats_url.get_secret_value()
    from libs.embedded import EmbeddedNats

    root = settings.home / "nats"
    port_file = root / "port"
    if not port_file.exists():
        raise SystemExit("no NATS: set HETEROFLOW_NATS_URL or run `heteroflow up`")
    return EmbeddedNats(root, port=int(port_file.read_text())).url


def _where(args: argparse.Namespace) -> tuple[str, list[Any]]:
    clauses: list[str] = ["TRUE"]
    params: list[Any] = []
    start = getattr(args, "start", None)
    if start:
        if start.isdigit():
            clauses.append("position >= %s")
            params.append(int(start))
        else:
            clauses.append("occurred_at >= %s")
            params.append(datetime.fromisoformat(start))
    if getattr(args, "to", None):
        clauses.append("position <= %s")
        params.append(int(args.to))
    if getattr(args, "stream", None):
        clauses.append("stream_id = ANY(%s)")
        params.append(list(args.stream))
    return " AND ".join(clauses), params


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
                "dry_run": args.dry_run,
            },
            indent=2,
        )
    )
    print(
        f"replayed {report.events} events in {report.seconds:.2f}s "
        f"({report.events_per_second:,.0f} events/s); {diff_rows} row(s) differed",
        file=sys.stderr,
    )
    return 1 if diff_rows else 0


async def _rows(conn: Any, where: str, params: list[Any], after: int, limit: int) -> list[Any]:
    cur = await conn.execute(
        "SELECT position, event_id, stream_id, stream_type, version, type, schema_version,"
        f" payload, occurred_at, metadata FROM events WHERE {where} AND position > %s"
        " ORDER BY position LIMIT %s",
        [*params, after, limit],
    )
    return list(await cur.fetchall())


def _envelope(r: Any) -> dict[str, Any]:
    from libs.store.types import StoredEvent

    return StoredEvent(*r).envelope()


async def _export(args: argparse.Namespace, follow: bool) -> int:
    import psycopg

    where, params = _where(args)
    out = open(args.output, "w") if getattr(args, "output", None) else sys.stdout  # noqa: SIM115, ASYNC230
    after = 0
    async with await psycopg.AsyncConnection.connect(
        _database_url(CommonSettings()), autocommit=True
    ) as conn:
        while True:
            rows = await _rows(conn, where, params, after, 5000)
            for r in rows:
                out.write(json.dumps(_envelope(r)) + "\n")
            out.flush()
            if rows:
                after = rows[-1][0]
            elif not follow:
                break
            else:
                await asyncio.sleep(0.5)
    if out is not sys.stdout:
        out.close()
    return 0


async def _republish(args: argparse.Namespace) -> int:
    """Publish a range again. Safe: the message id is the event id, so JetStream drops what
    it still holds (2-minute window) and consumers are idempotent for the rest."""
    import psycopg

    from libs.bus.nats import connect, ensure_streams
    from libs.store.relay import OutboxEvent, envelope_of, headers_of, subject_of

    settings = CommonSettings()
    where, params = _where(args)
    nc = await connect(_nats_url(settings), "events-republish")
    js = nc.jetstream()
    await ensure_streams(js)
    sent = 0
    async with await psycopg.AsyncConnection.connect(_database_url(settings)) as conn:
        after = 0
        while rows := await _rows(conn, where, params, after, 1000):
            for r in rows:
                ev = OutboxEvent(
                    position=r[0],
                    event_id=r[1],
                    stream_id=r[2],
                    stream_type=r[3],
                    version=r[4],
                    type=r[5],
                    schema_version=r[6],
                    payload=r[7],
                    occurred_at=r[8],
                    metadata=r[9],
                    tx_id="0",
                )
                await js.publish(subject_of(ev), envelope_of(ev), headers=headers_of(ev))
                sent += 1
            after = rows[-1][0]
    await nc.close()
    print(f"republished {sent} event(s)", file=sys.stderr)
    return 0


OPS = ("replay", "tail", "export", "republish")


def build_ops_parser() -> argparse.ArgumentParser:
    """`heteroflow events replay|tail|export|republish` (`heteroflow events TASK_ID` is the
    user command showing a task's timeline)."""
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
    return parser
