"""No request of the API waits on a worker thread for plain Python: FastAPI runs a `def`
dependency or endpoint in anyio's thread pool (a hand-off and a wake-up per request, about a
fifth of the gateway's CPU per create when the query check was one), so every dependency and
endpoint of the app is `async def`. A blocking call inside one goes through
`asyncio.to_thread` where it is, by name."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from libs.config import GatewaySettings
from services.api_gateway.app import create_app


def _calls(dependant: Dependant) -> Iterator[Any]:
    for sub in dependant.dependencies:
        if sub.call is not None:
            yield sub.call
        yield from _calls(sub)


def _api_routes(routes: list[Any]) -> Iterator[APIRoute]:
    """Every APIRoute, through included routers (FastAPI keeps each included router whole)."""
    for r in routes:
        if isinstance(r, APIRoute):
            yield r
        elif (inner := getattr(r, "original_router", None)) is not None:
            yield from _api_routes(inner.routes)


def _router_dependencies(routes: list[Any]) -> Iterator[Any]:
    for r in routes:
        if (inner := getattr(r, "original_router", None)) is not None:
            yield from (d.dependency for d in inner.dependencies)
            yield from _router_dependencies(inner.routes)


def _is_async(call: Any) -> bool:
    target = call if inspect.isroutine(call) else getattr(call, "__call__", call)  # noqa: B004
    return inspect.iscoroutinefunction(target) or inspect.isasyncgenfunction(target)


def test_every_dependency_and_endpoint_is_async() -> None:
    app = create_app(GatewaySettings(), store=None)
    routes = list(_api_routes(app.routes))
    assert len(routes) > 50, "the app's routes were found"
    sync = sorted(
        {
            f"{r.path} {sorted(r.methods or ())}: {getattr(call, '__qualname__', call)}"
            for r in routes
            for call in [r.endpoint, *_calls(r.dependant)]
            if not _is_async(call)
        }
        | {
            f"a router's dependency: {getattr(call, '__qualname__', call)}"
            for call in _router_dependencies(app.routes)
            if call is not None and not _is_async(call)
        }
    )
    assert not sync, "run in a worker thread per request:\n" + "\n".join(sync)
