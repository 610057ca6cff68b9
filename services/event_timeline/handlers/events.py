"""Committed events become timeline entries: parse → map with the pure rules → insert.

It reads committed events from the bus (so an entry is written only after its transition
committed), maps each with the rule of its payload type (`rules.RULES`), and inserts the
entries in one transaction with the consumer's receipt for the event (libs/store/inbox.py):
a redelivered or republished event adds nothing. It keeps at most `cap` entries per task and
per group and purges entries older than the retention. A consumer created on an existing
store starts at the stream's end: history is never back-filled.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import timedelta

import structlog
from prometheus_client import Counter

from libs.bus.typed import EventHandlers, OnEvent
from libs.domain.envelope import EventEnvelope
from libs.domain.node.events import GpuLost, GpuRecovered
from libs.store import inbox
from libs.store import tasks as task_rows
from libs.store import timeline as timeline_rows
from libs.store.eventstore import EventStore

from .. import rules
from ..entry import Entry
from ..routes import CONSUMER

log = structlog.get_logger(__name__)

WRITTEN = Counter("heteroflow_timeline_entries_total", "Timeline entries written", ["kind"])

# Card events are also shown on the timeline of each task holding the card.
CARD_RULES = (rules.gpu_lost, rules.gpu_recovered)


class Timeline:
    def __init__(self, store: EventStore, retention: timedelta, cap: int) -> None:
        self.store = store
        self.retention = retention
        self.cap = cap
        plain = [self._recording(rule) for rule in rules.RULES.values() if rule not in CARD_RULES]
        self.handlers = EventHandlers.of(
            *plain, self.on_gpu_lost, self.on_gpu_recovered, owner=CONSUMER
        )

    async def handle(self, envelope: EventEnvelope) -> None:
        """One envelope off the bus: parsed, then recorded if a rule takes its type."""
        await self.handlers(envelope)

    def _recording(self, rule: rules.Rule) -> OnEvent:
        """A handler that records what `rule` maps an event to; it takes the rule's
        signature (`(env, ev: SomePayload)`), from which the payload model is read."""

        @functools.wraps(rule)
        async def on_event(env: EventEnvelope, ev: object) -> None:
            await self.record(env, rule(env, ev))

        return on_event

    async def on_gpu_lost(self, env: EventEnvelope, ev: GpuLost) -> None:
        base = rules.gpu_lost(env, ev)
        await self.record(env, base + await self._card_holders(ev.node_id, ev.gpu_id, base))

    async def on_gpu_recovered(self, env: EventEnvelope, ev: GpuRecovered) -> None:
        base = rules.gpu_recovered(env, ev)
        await self.record(env, base + await self._card_holders(ev.node_id, ev.gpu_id, base))

    async def _card_holders(self, node_id: str, card: str, base: Sequence[Entry]) -> list[Entry]:
        """The same card event on the timeline of each task holding that card."""
        holders = await task_rows.ids_holding_card(self.store, node_id, card)
        e = base[0]
        return [
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
            for task_id in holders
        ]

    async def record(self, env: EventEnvelope, entries: Sequence[Entry]) -> None:
        if entries:
            await self.write(entries, inbox.Receipt(CONSUMER, env.event_id))

    async def write(self, entries: Sequence[Entry], receipt: inbox.Receipt) -> None:
        if not await timeline_rows.write(self.store, entries, self.cap, receipt):
            return
        for e in entries:
            WRITTEN.labels(e.kind).inc()

    async def purge(self) -> int:
        return await timeline_rows.purge(self.store, self.retention)
