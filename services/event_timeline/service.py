"""The event-timeline service: one timeline entry per real fault-tolerance transition.

It reads committed events from the bus (so an entry is written only after its transition
committed), maps them with the pure rules, and inserts the entries in one transaction with
the consumer's receipt for the event (libs/store/inbox.py): a redelivered or republished event
adds nothing. It keeps at most 200 entries per task and per group and purges
entries older than 30 days. A consumer created on an existing store starts at the stream's
end: history is never back-filled.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import structlog
from nats.aio.msg import Msg
from prometheus_client import Counter
from pydantic import Field

from libs.bus.consume import consume
from libs.bus.subjects import EVENTS_STREAM, EVENTS_SUBJECTS, NODE_PREFIX
from libs.config import CommonSettings
from libs.periodic import periodic
from libs.service import ServiceContext
from libs.store import inbox
from libs.store import tasks as task_rows
from libs.store import timeline as timeline_rows
from libs.store.eventstore import EventStore

from .rules import Entry, entries_for
from .telemetry import TelemetrySink

log = structlog.get_logger(__name__)

CONSUMER = "event-timeline"
WRITTEN = Counter("heteroflow_timeline_entries_total", "Timeline entries written", ["kind"])


class TimelineSettings(CommonSettings):
    timeline_retention_days: float = Field(default=30.0, gt=0)
    timeline_max_per_subject: int = Field(default=200, gt=0)
    timeline_purge_interval_s: float = 3600.0


class Timeline:
    def __init__(self, store: EventStore, retention: timedelta, cap: int) -> None:
        self.store = store
        self.retention = retention
        self.cap = cap

    async def handle(self, msg: Msg) -> None:
        envelope = json.loads(msg.data)
        entries = entries_for(envelope)
        if envelope.get("type") in ("gpu_lost", "gpu_recovered"):
            entries += await self._card_holders(envelope, entries)
        if entries:
            await self.write(entries, inbox.Receipt.of(CONSUMER, envelope))

    async def _card_holders(self, env: dict[str, Any], base: Sequence[Entry]) -> list[Entry]:
        """The same card event on the timeline of each task holding that card."""
        card = env["payload"]["gpu_id"]
        holders = await task_rows.ids_holding_card(self.store, env["payload"]["node_id"], card)
        out = []
        for task_id in holders:
            e = base[0]
            out.append(
                Entry(
                    id=f"{e.source_event}:task:{task_id}",
                    subject_type="task",
                    subject_id=task_id,
                    kind=e.kind,
                    message=e.message + " (task neither moved nor failed)",
                    occurred_at=e.occurred_at,
                    source_event=e.source_event,
                    details=e.details,
                )
            )
        return out

    async def write(self, entries: Sequence[Entry], receipt: inbox.Receipt) -> None:
        if not await timeline_rows.write(self.store, entries, self.cap, receipt):
            return
        for e in entries:
            WRITTEN.labels(e.kind).inc()

    async def purge(self) -> int:
        return await timeline_rows.purge(self.store, self.retention)


async def run(ctx: ServiceContext, stop: asyncio.Event, settings: TimelineSettings) -> None:
    timeline = Timeline(
        ctx.store,
        timedelta(days=settings.timeline_retention_days),
        settings.timeline_max_per_subject,
    )

    sink = TelemetrySink(ctx.store)
    telemetry_sub = await ctx.nc.subscribe(
        f"{NODE_PREFIX}.*.telemetry", queue="telemetry", cb=sink.handle
    )

    async def purge() -> None:
        await sink.purge(settings.timeline_retention_days)
        purged = await timeline.purge()
        await inbox.purge(ctx.store, CONSUMER)
        if purged:
            log.info("timeline_purged", entries=purged)

    try:
        await _serve(
            ctx,
            stop,
            timeline,
            periodic("timeline_purge", purge, stop, settings.timeline_purge_interval_s),
        )
    finally:
        await telemetry_sub.unsubscribe()


async def _serve(ctx: ServiceContext, stop: asyncio.Event, timeline: Timeline, purge: Any) -> None:
    await asyncio.gather(
        consume(
            ctx.js,
            stream=EVENTS_STREAM,
            durable=CONSUMER,
            filter_subject=EVENTS_SUBJECTS[0],
            handler=timeline.handle,
            stop=stop,
            deliver_new=True,
        ),
        purge,
    )
