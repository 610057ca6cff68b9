"""Replay suite: `heteroflow events replay` over a store of ≥100k events.

The store is seeded with real domain events (TaskCreated + four transitions per task, from
the payload models, written with COPY), projected once by a first replay, and then replayed
again: that second replay is measured and must report zero differences. Target ≥50k events/s.
"""

from __future__ import annotations

import argparse
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg.types.json import Jsonb

from libs.domain.events import Payload, TaskCreated, TaskStatusChanged
from libs.domain.reasons import ReasonCode
from libs.domain.states import TaskStatus as S
from libs.domain.task import TaskId, TaskSpec, TenantId
from libs.store.eventstore import EventStore
from libs.store.replay import rebuild

from . import Context
from .report import Row, against

DESCRIPTION = "rebuild every projection from ≥100k events; events/s and differences"
PATH = (S.SCHEDULED, S.STARTING, S.RUNNING, S.COMPLETED)
TARGET = 50_000.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("replay")
    group.add_argument(
        "--replay-tasks",
        type=int,
        default=20_000,
        help="tasks to seed, five events each (default 20000 → 100k events)",
    )


def seed(url: str, tasks: int) -> int:
    spec = TaskSpec(name="bench", image="busybox:latest", gpu_required=1)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    rows = 0
    with (
        psycopg.connect(url) as conn,
        conn.cursor() as cur,
        cur.copy(
            "COPY events (event_id, stream_id, stream_type, version, type, schema_version,"
            " payload, metadata, occurred_at) FROM STDIN"
        ) as copy,
    ):
        for i in range(tasks):
            tid = TaskId(f"task-bench-{i:07d}")
            at = t0 + timedelta(milliseconds=i)
            events: list[Payload] = [
                TaskCreated(task_id=tid, tenant_id=TenantId("bench"), spec=spec)
            ]
            src = S.PENDING
            for to in PATH:
                events.append(
                    TaskStatusChanged(
                        task_id=tid,
                        from_status=src,
                        to_status=to,
                        actor="scheduler",
                        reason_code=ReasonCode.REPORTED,
                        node_id="n1",
                    )
                )
                src = to
            for version, ev in enumerate(events, start=1):
                copy.write_row(
                    (
                        uuid.uuid4(),
                        tid,
                        ev.stream_type,
                        version,
                        ev.type,
                        ev.schema_version,
                        Jsonb(ev.model_dump(mode="json")),
                        Jsonb({}),
                        at + timedelta(microseconds=version),
                    )
                )
                rows += 1
    return rows


async def run(ctx: Context) -> list[Row]:
    with ctx.database() as url:
        store = await EventStore.open(url, max_size=2)  # runs migrations
        try:
            seeded = seed(url, ctx.args.replay_tasks)
            await rebuild(store)  # the live projections, as the append path would have left
            report = await rebuild(store, dry_run=True)
        finally:
            await store.close()
    differing = sum(len(v) for v in report.differences.values())
    return [
        Row("replay.events", float(report.events), "events", note=f"{seeded} seeded"),
        against(
            "replay.rate",
            report.events_per_second,
            "events/s",
            ctx.floors.pg_batched,
            f"target {TARGET:,.0f} events/s; fold + COPY + SQL comparison",
        ),
        Row("replay.differences", float(differing), "rows", note="must be 0"),
    ]
