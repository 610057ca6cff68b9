"""Replay suite: `heteroflow events replay` over a store of ≥100k events.

The store is seeded with real domain events (TaskCreated + four transitions per task, from
the payload models, written with COPY) and with the projection rows the live path makes of
them (`evolve_task` and the projection's row, as the append transaction writes them). A dry
replay is then measured: it rebuilds every projection with replay's own fold and must report
zero differences from the live rows. Target ≥50k events/s.
"""

from __future__ import annotations

import argparse
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg import Copy
from psycopg.types.json import Jsonb

from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.task.events import TaskCreated, TaskStatusChanged
from libs.domain.task.evolve import evolve_task
from libs.domain.task.model import Task, TaskId, TaskSpec, TenantId
from libs.domain.task.states import TaskStatus as S
from libs.store.eventstore import EventStore
from libs.store.projections import TASK_COLUMNS, task_row
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
    """Write the events and the live projection rows; return the number of events."""
    spec = TaskSpec(name="bench", image="busybox:latest", gpu_required=1)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    live: list[Task] = []
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        with cur.copy(
            "COPY events (event_id, stream_id, stream_type, version, type, schema_version,"
            " payload, metadata, occurred_at) FROM STDIN"
        ) as copy:
            rows = _seed_events(copy, spec, t0, tasks, live)
        with cur.copy(f"COPY tasks ({TASK_COLUMNS}) FROM STDIN") as copy:
            for task in live:
                copy.write_row(task_row(task))
    return rows


def _seed_events(copy: Copy, spec: TaskSpec, t0: datetime, tasks: int, live: list[Task]) -> int:
    rows = 0
    for i in range(tasks):
        tid = TaskId(f"task-bench-{i:07d}")
        at = t0 + timedelta(milliseconds=i)
        events: list[Payload] = [TaskCreated(task_id=tid, tenant_id=TenantId("bench"), spec=spec)]
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
        task: Task | None = None
        for version, ev in enumerate(events, start=1):
            occurred = at + timedelta(microseconds=version)
            task = evolve_task(task, ev, occurred, version)  # what the append projects
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
                    occurred,
                )
            )
            rows += 1
        assert task is not None
        live.append(task)
    return rows


async def run(ctx: Context) -> list[Row]:
    with ctx.database() as url:
        store = await EventStore.open(url, max_size=2)  # runs migrations
        try:
            seeded = seed(url, ctx.args.replay_tasks)
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
