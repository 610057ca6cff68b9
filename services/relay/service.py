"""The relay process: publishes committed events from the outbox to JetStream until stopped.

The relay itself lives in libs/store/relay.py (it reads the events table, which only
libs/store may); this module is its process: settings, run, the routes it declares.
"""

from __future__ import annotations

import asyncio

from libs.config import CommonSettings
from libs.health import READINESS
from libs.service import ServiceContext
from libs.store.relay import OutboxRelay, routes

__all__ = ["RelaySettings", "routes", "run"]


class RelaySettings(CommonSettings):
    """The relay reads the common settings only."""


async def run(ctx: ServiceContext, stop: asyncio.Event, settings: RelaySettings) -> None:
    # Its own connection: the relay LISTENs for commits and reads in snapshot order, outside
    # the store's pool (libs/store/relay.py).
    async with OutboxRelay(ctx.database_url, ctx.js) as relay:
        # Not ready while it cannot publish (or read): its last round's failure, named.
        READINESS.report("relay", lambda: relay.failure)
        try:
            await relay.run(stop)
        finally:
            READINESS.withdraw("relay")
