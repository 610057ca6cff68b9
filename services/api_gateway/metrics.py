"""Prometheus: `/metrics` (no auth, like the health endpoints) and per-request counters.

In `heteroflow up` every service runs in this process, so this endpoint shows all of them;
a service run alone (`heteroflow service NAME`) serves its own on HETEROFLOW_METRICS_PORT.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest

REQUESTS = Counter("heteroflow_http_requests_total", "HTTP requests", ["method", "route", "status"])
LATENCY = Histogram("heteroflow_http_request_seconds", "HTTP request latency", ["method", "route"])


def install(app: FastAPI) -> None:
    @app.middleware("http")
    async def count(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        started = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        REQUESTS.labels(request.method, path, str(response.status_code)).inc()
        LATENCY.labels(request.method, path).observe(time.perf_counter() - started)
        return response

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
