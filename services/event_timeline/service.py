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
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import structlog
from prometheus_client import Counter
from pydantic import Field

from libs.bus.broker import Handle, Routes, serve
from libs.bus.subjects import EVENTS_PREFIX, EVENTS_STREAM, NODE_PREFIX, node_of_subject
from libs.config import CommonSettings
from libs.domain.envelope import EventEnvelope
from libs.domain.telemetry import TelemetryBatch
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

    async def handle(self, event: EventEnvelope) -> None:
        envelope = event.as_json()  # the rules read plain JSON, as `events export` writes it
        entries = entries_for(envelope)
        if envelope.get("type") in ("gpu_lost", "gpu_recovered"):
            entries += await self._card_holders(envelope, entries)
        if entries:
            await self.write(entries, inbox.Receipt(CONSUMER, event.event_id))

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

    async def purge() -> None:
        await sink.purge(settings.timeline_retention_days)
        purged = await timeline.purge()
        await inbox.purge(ctx.store, CONSUMER)
        if purged:
            log.info("timeline_purged", entries=purged)

    await asyncio.gather(
        serve(ctx.nc, [routes(timeline.handle, sink.handle)], stop),
        periodic("timeline_purge", purge, stop, settings.timeline_purge_interval_s),
    )


def routes(events: Handle[EventEnvelope], telemetry: Handle[TelemetryBatch]) -> Routes:
    """The timeline's subscribers (handlers as arguments: see heteroflow/asyncapi.py)."""
    r = Routes("event-timeline")
    r.durable(
        EventEnvelope,
        events,
        stream=EVENTS_STREAM,
        durable=CONSUMER,
        subject=f"{EVENTS_PREFIX}.{{stream_type}}.{{stream_id}}.{{event_type}}",
        description="Every committed event; the fault-tolerance transitions become entries.",
        deliver_new=True,
    )
    r.core(
        TelemetryBatch,
        telemetry,
        subject=f"{NODE_PREFIX}.{{node_id}}.telemetry",
        queue="telemetry",
        description="GPU samples (core NATS: a lost sample is a gap, not an error); a batch "
        "naming another node than its subject's is dropped.",
        accept=from_its_node,
    )
    return r


def from_its_node(subject: str, batch: TelemetryBatch) -> bool:
    """Samples speak for the node whose subject they came on (agents publish only there)."""
    return node_of_subject(subject) == batch.node_id
