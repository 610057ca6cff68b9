"""The api-gateway app: SPEC §2 over HTTP, health endpoints without auth."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from nats.aio.client import Client

from libs import auth
from libs.config import GatewaySettings
from libs.diskspace import DiskSpace
from libs.health import READINESS
from libs.store import pool
from libs.store.eventstore import EventStore

from . import (
    contract,
    errors,
    gpu,
    limits,
    metrics,
    routes_cards,
    routes_groups,
    routes_jobs,
    routes_ops,
    routes_plan,
    routes_pools,
    routes_queues,
    routes_rollout,
    routes_scale,
    routes_serve,
    routes_tasks,
    routes_tenants,
    shedding,
)
from .console import routes as console
from .console import web as console_web
from .queueing import HeldQueues
from .responses import FastJSONResponse
from .serving import ServingRouter

API_TITLE = "HeteroFlow API"
READY_CHECK_TIMEOUT_S = 2.0
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
                settings.database_url.get_secret_value(),
                max_size=settings.db_pool_max,
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
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = contract.complete(generate(), app.routes, settings)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.state.settings = settings
    app.state.store = store
    app.state.nc = nc
    app.state.serving = None  # the router, made on the first /serve/ request
    app.state.auth_cache = auth.CredentialCache(settings.auth_cache_ttl_s)
    app.state.held_queues = HeldQueues()
    app.state.disk = DiskSpace(
        settings.home, settings.disk_min_free_mb, settings.disk_min_free_percent
    )
    app.state.tenant_rates = shedding.TenantRates(
        settings.tenant_write_rate_per_s, settings.tenant_write_burst
    )
    errors.install(app)
    # Before the create routers: `/tasks/plan` is not a task id (no `/{id}` route takes it).
    app.include_router(routes_plan.router)
    app.include_router(routes_tasks.router)
    app.include_router(routes_ops.router)
    app.include_router(routes_cards.router)
    app.include_router(gpu.router)
    app.include_router(gpu.group_router)
    app.include_router(routes_groups.router)
    app.include_router(routes_scale.router)
    app.include_router(routes_rollout.router)
    app.include_router(routes_tenants.router)
    app.include_router(routes_pools.router)
    app.include_router(routes_queues.router)
    app.include_router(routes_jobs.router)
    app.include_router(routes_serve.router)
    app.include_router(console.router)
    console_web.install(app)
    app.mount("/ui/static", StaticFiles(directory=console_web.STATIC), name="console-static")

    # Inside the body limit: a slot in flight is taken once the body is read, so a client
    # that sends slowly holds only its own connection (bounded by the body deadline).
    app.add_middleware(
        shedding.Shedding,
        max_reads=settings.max_inflight_reads,
        max_writes=settings.max_inflight_writes,
        db_wait_s=settings.db_wait_timeout_s,
        rates=app.state.tenant_rates,
        credentials=app.state.auth_cache,
        disk=app.state.disk,
        max_writes_per_tenant=settings.max_inflight_writes_per_tenant,
    )
    # Inside the metrics middleware, so refused bodies are counted too.
    app.add_middleware(limits.BodyLimit, max_bytes=settings.max_body_bytes)
    metrics.install(app)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, Any]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz() -> JSONResponse:
        """Ready when every dependency answers; each is named with its state: "ok" or why
        not (`postgres`, `nats`, `disk_space`; in `up`'s one-process mode also
        `jetstream_writes`, its write probe, and `relay`, its last round)."""
        checks = {"postgres": await _postgres(app.state.store)}
        if app.state.nc is not None:
            checks["nats"] = "ok" if app.state.nc.is_connected else "not connected"
        checks["disk_space"] = app.state.disk.cause() or "ok"
        checks |= READINESS.reports()
        ready = all(state == "ok" for state in checks.values())
        body = {"status": "ok" if ready else "unavailable", "checks": checks}
        return FastJSONResponse(body, 200 if ready else 503)

    return app


async def _postgres(store: EventStore) -> str:
    try:
        await asyncio.wait_for(pool.ping(store), READY_CHECK_TIMEOUT_S)
    except TimeoutError:
        return f"no answer within {READY_CHECK_TIMEOUT_S:g} s"
    except Exception as exc:  # noqa: BLE001 - readiness reports any failure
        return str(exc)[:300] or type(exc).__name__
    return "ok"
