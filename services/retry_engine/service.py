"""The retry-engine service: consumes failures, writes its decision, requeues with CAS.

Wiring only: the consumer is `handlers/failures.py`, the pure decision `decide.py`, the
subscriber `routes.py`, the settings `settings.py`.
"""

from __future__ import annotations

import asyncio

from libs.bus.broker import serve
from libs.periodic import periodic
from libs.service import ServiceContext
from libs.store import inbox

from .handlers.failures import RetryEngine, node_facts
from .routes import CONSUMER, routes
from .settings import RetrySettings

INBOX_PURGE_INTERVAL_S = 3600.0


async def run(ctx: ServiceContext, stop: asyncio.Event, settings: RetrySettings) -> None:
    engine = RetryEngine(ctx.store, settings.config())

    async def purge() -> None:
        await inbox.purge(ctx.store, CONSUMER)

    await asyncio.gather(
        serve(ctx.nc, [routes(engine.handlers)], stop),
        periodic("inbox_purge", purge, stop, INBOX_PURGE_INTERVAL_S),
    )


__all__ = ["CONSUMER", "RetryEngine", "RetrySettings", "node_facts", "routes", "run"]
