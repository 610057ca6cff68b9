"""What every service process holds (`ServiceContext`: the store, a NATS connection,
JetStream) and what a service declares about itself (`ServiceSpec`).

Each `services/<name>/__init__.py` exports one `SERVICE = ServiceSpec(...)`;
`heteroflow/services.py` lists them, and `up`, `heteroflow service NAME`, `up --processes`,
readiness, the NATS users and the AsyncAPI document all iterate that one list.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client
from nats.js import JetStreamContext
from pydantic_settings import BaseSettings

from libs.bus.broker import Routes
from libs.bus.nats import connect, ensure_streams
from libs.bus.permissions import NatsUser
from libs.store.eventstore import EventStore


@dataclass
class ServiceContext:
    store: EventStore
    nc: Client
    js: JetStreamContext
    name: str
    # Where the context logged in: a process that opens connections of its own (the relay's
    # LISTEN connection, the gateway's worker processes) reads them here.
    database_url: str = ""
    nats_url: str = ""

    @classmethod
    async def open(
        cls, database_url: str, nats_url: str, name: str, pool_max: int = 10
    ) -> ServiceContext:
        store = await EventStore.open(database_url, max_size=pool_max)
        nc = await connect(nats_url, name)
        js = nc.jetstream()
        await ensure_streams(js)
        return cls(store, nc, js, name, database_url, nats_url)

    async def close(self) -> None:
        await self.nc.drain()
        await self.store.close()


ServiceRun = Callable[[ServiceContext, asyncio.Event, Any], Awaitable[None]]


@dataclass(frozen=True)
class ServiceSpec:
    """One control-plane service, declared once.

    * `name`: the process (`heteroflow service NAME`, its Deployment, its log lines).
    * `Settings`: its pydantic-settings class, read from the environment when it starts.
      `up` hands a service whose settings class the platform's settings extend (the
      api-gateway) the platform's own settings instead.
    * `run`: `async def run(ctx, stop, settings)`, until `stop` is set.
    * `routes`: builds the process's `Routes` with handlers that are never called: the
      AsyncAPI document is generated from them, and the process is ready once every durable
      consumer they declare pulls (`consumers`).
    * `nats_user`: the NATS user it logs in as and what that user may publish.
    * `lease_ttl_s`: set when the process runs leader-only controllers: the TTL of the lease
      bucket `up` declares for them.
    * `up_flag`: a boolean setting of `heteroflow up` that must be true for `up` to run the
      service in its own process (None: always).
    * `pool_max`: the largest connection pool it opens, from its settings.
    * `loop`: an event-loop factory for `heteroflow service NAME` (None: asyncio's).
    """

    name: str
    Settings: type[BaseSettings]
    run: ServiceRun
    routes: Callable[[], Routes]
    nats_user: NatsUser
    lease_ttl_s: float | None = None
    up_flag: str | None = None
    pool_max: Callable[[Any], int] = lambda _settings: 10
    loop: Callable[[], asyncio.AbstractEventLoop] | None = None

    def consumers(self) -> tuple[str, ...]:
        """The durable consumers the process runs: it is not ready until all of them pull."""
        return tuple(d.durable for d in self.routes().durables)


async def _never_called(_message: Any) -> Any:
    raise AssertionError("documentation only")  # pragma: no cover


def documented(build: Callable[..., Routes]) -> Callable[[], Routes]:
    """`build` (a service's `routes`) with a never-called handler for each parameter it
    requires, the others left at their defaults: the routes as declared, for AsyncAPI and
    readiness, without the objects a running service hands its handlers."""

    def routes() -> Routes:
        params = inspect.signature(build).parameters.values()
        handlers = {
            p.name: _never_called
            for p in params
            if p.default is inspect.Parameter.empty
            and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        }
        return build(**handlers)

    return routes
