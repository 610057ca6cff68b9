"""The api-gateway app: SPEC §2 over HTTP, health endpoints without auth."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from nats.aio.client import Client

from libs import auth
from libs.config import GatewaySettings
from libs.store import pool
from libs.store.eventstore import EventStore

from . import (
    errors,
    gpu,
    limits,
    metrics,
    routes_groups,
    routes_ops,
    routes_serve,
    routes_tasks,
    routes_tenants,
)
from .responses import FastJSONResponse
from .serving import ServingRouter

API_TITLE = "HeteroFlow API"
API_VERSION = "1.0.0"


def create_app(
    settings: GatewaySettings, store: EventStore | None = None, nc: Client | None = None
) -> FastAPI:
    """Build the app. With `store=None` it opens one from `settings.database_url` on start."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = store is None
        if owned:
            assert settings.database_url is not None, "database_url is required"
            app.state.store = await EventStore.open(
                settings.database_url.get_secret_value(), max_size=settings.db_pool_max
            )
        app.state.serving = ServingRouter(app.state.store, settings, nc)
        stop = asyncio.Event()
        background = asyncio.create_task(app.state.serving.run(stop))
        yield
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(background, 10)
        await app.state.serving.close()
        if owned:
            await app.state.store.close()

    app = FastAPI(title=API_TITLE, version=API_VERSION, lifespan=lifespan)
    app.state.settings = settings
    app.state.store = store
    app.state.nc = nc
    app.state.serving = None  # the router, made on the first /serve/ request
    app.state.auth_cache = auth.CredentialCache(settings.auth_cache_ttl_s)
    errors.install(app)
    app.include_router(routes_tasks.router)
    app.include_router(routes_ops.router)
    app.include_router(gpu.router)
    app.include_router(routes_groups.router)
    app.include_router(routes_tenants.router)
    app.include_router(routes_serve.router)

    # Inside the metrics middleware, so refused bodies are counted too.
    app.add_middleware(limits.BodyLimit, max_bytes=settings.max_body_bytes)
    metrics.install(app)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, Any]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz() -> JSONResponse:
        try:
            await pool.ping(app.state.store)
        except Exception as exc:  # noqa: BLE001 - readiness reports any failure
            return FastJSONResponse({"status": "unavailable", "error": str(exc)}, 503)
        return FastJSONResponse({"status": "ok"})

    return app
