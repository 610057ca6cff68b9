"""The probe port of a lone process (`heteroflow service NAME`, `heteroflow agent`).

On `HETEROFLOW_METRICS_PORT` it serves `/healthz` (the process runs), `/readyz` (200 once the
process has connected and started its consumers, 503 with what is missing before) and
`/metrics` (Prometheus). `heteroflow up --processes` waits on every child's `/readyz`. The
consumers a service waits for are the durables its routes declare (`ServiceSpec.consumers`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Sequence

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from libs.health import READINESS
from libs.store import health as store_health
from libs.store.eventstore import EventStore


def agent_consumers(node_id: str) -> tuple[str, ...]:
    return (f"agent-{node_id}",)


class ProbeServer(uvicorn.Server):
    """uvicorn without its own signal handling: the process owns shutdown."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def readiness(
    consumers: Sequence[str], store: Callable[[], EventStore | None] = lambda: None
) -> Callable[[], Awaitable[list[str]]]:
    """What /readyz checks: the registered conditions, the consumers, the database."""

    async def unmet() -> list[str]:
        missing = READINESS.unmet(consumers)
        db = store()
        if db is not None and not await store_health.answers(db):
            missing.append("database does not answer")
        return missing

    return unmet


def probe_app(unmet: Callable[[], Awaitable[list[str]]]) -> Starlette:
    async def healthz(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def readyz(_: Request) -> JSONResponse:
        missing = await unmet()
        if missing:
            return JSONResponse({"status": "unavailable", "missing": missing}, 503)
        return JSONResponse({"status": "ok"})

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
        ]
    )


@contextlib.asynccontextmanager
async def serve_probe(
    port: int, unmet: Callable[[], Awaitable[list[str]]], host: str = "127.0.0.1"
) -> AsyncIterator[None]:
    """Serve the probe while the block runs; port 0 serves nothing."""
    if not port:
        yield
        return
    server = ProbeServer(
        uvicorn.Config(
            probe_app(unmet),
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            lifespan="off",
        )
    )
    task = asyncio.create_task(server.serve())
    try:
        yield
    finally:
        server.should_exit = True
        await task
