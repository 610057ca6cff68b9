"""The event-timeline service: one timeline entry per real fault-tolerance transition.

Wiring only: the consumers are `handlers/events.py` (committed events → entries, with the
pure `rules.py`) and `handlers/telemetry.py` (GPU samples); the subscribers are `routes.py`,
the settings `settings.py`. Entries and samples past the retention are purged periodically.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import structlog

from libs.bus.broker import serve
from libs.periodic import periodic
from libs.service import ServiceContext
from libs.store import inbox

from .handlers.events import Timeline
from .handlers.telemetry import TelemetrySink
from .routes import CONSUMER, from_its_node, routes
from .settings import TimelineSettings

log = structlog.get_logger(__name__)


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
        serve(ctx.nc, [routes(timeline.handlers, sink.handle)], stop),
        periodic("timeline_purge", purge, stop, settings.timeline_purge_interval_s),
    )


__all__ = [
    "CONSUMER",
    "TelemetrySink",
    "Timeline",
    "TimelineSettings",
    "from_its_node",
    "routes",
    "run",
]
