"""Prometheus: `/metrics` (no auth, like the health endpoints) and per-request counters.

In `heteroflow up` every service runs in this process, so this endpoint shows all of them;
a service run alone (`heteroflow service NAME`) serves its own on HETEROFLOW_METRICS_PORT.
With several gateway workers (HETEROFLOW_GATEWAY_WORKERS) each answers with its own
counters: a scrape sees whichever worker took the connection.

The counters are kept by a plain ASGI middleware: starlette's `@app.middleware("http")`
runs every request in a task group and re-streams its response, about a tenth of the
gateway's CPU per request.
"""

from __future__ import annotations

import time

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUESTS = Counter("heteroflow_http_requests_total", "HTTP requests", ["method", "route", "status"])
LATENCY = Histogram("heteroflow_http_request_seconds", "HTTP request latency", ["method", "route"])


class RequestMetrics:
    """Count each HTTP request by method, route template and status, and time it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the server answers when the app fails before it starts a response

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            # The router writes the matched route into the scope it was given.
            path = getattr(scope.get("route"), "path", "unmatched")
            method = scope["method"]
            REQUESTS.labels(method, path, str(status)).inc()
            LATENCY.labels(method, path).observe(time.perf_counter() - started)


def install(app: FastAPI) -> None:
    app.add_middleware(RequestMetrics)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
