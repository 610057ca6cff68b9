"""What every service process holds: the store, a NATS connection, JetStream, a stop event."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nats.aio.client import Client
from nats.js import JetStreamContext

from libs.bus.nats import connect, ensure_streams
from libs.store.eventstore import EventStore


@dataclass
class ServiceContext:
    store: EventStore
    nc: Client
    js: JetStreamContext
    name: str

    @classmethod
    async def open(
        cls, database_url: str, nats_url: str, name: str, pool_max: int = 10
    ) -> ServiceContext:
        store = await EventStore.open(database_url, max_size=pool_max)
        nc = await connect(nats_url, name)
        js = nc.jetstream()
        await ensure_streams(js)
        return cls(store, nc, js, name)

    async def close(self) -> None:
        await self.nc.drain()
        await self.store.close()


ServiceMain = Callable[[ServiceContext, asyncio.Event], Awaitable[None]]
