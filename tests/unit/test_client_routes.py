"""Every route of the gateway has its call in the Python client: each public method of each
resource is called once over a recording transport, and every `/api/v1` operation of the
app's OpenAPI document (with `/readyz`) must have been asked at least once."""

from __future__ import annotations

import inspect
import re
from typing import Any

import httpx

from heteroflow.client import Client
from libs.config import GatewaySettings
from services.api_gateway.app import create_app

ARGS: dict[str, Any] = {
    "body": {},
    "replicas": 1,
    "subject": "s",
    "auto_scale": None,
    "schedule_window": None,
}


def _calls() -> set[tuple[str, str]]:
    asked: set[tuple[str, str]] = set()

    def handler(request: httpx.Request) -> httpx.Response:
        asked.add((request.method, request.url.path))
        if request.url.params.get("follow") == "true":
            return httpx.Response(200, content=b"event: end\ndata: {}\n\n")
        return httpx.Response(200, json={})

    with Client("http://gw", "tok", transport=httpx.MockTransport(handler)) as c:
        for resource in (c.tasks, c.groups, c.jobs, c.queues, c.pools, c.nodes, c.tenants):
            for name, method in inspect.getmembers(resource, inspect.ismethod):
                if name.startswith("_") or name == "action":
                    continue
                params = inspect.signature(method).parameters.values()
                args = [
                    ARGS.get(p.name, "x1")
                    for p in params
                    if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD
                ]
                answer = method(*args)
                if not isinstance(answer, dict):
                    list(answer)  # an iterator: walk it
        c.ready()
        c.serve("x1", "v1/models")
    return asked


def _pattern(template: str) -> re.Pattern[str]:
    parts = re.split(r"(\{[^}]+\})", template)
    regex = "".join(
        (".*" if p.endswith(":path}") else "[^/]+") if p.startswith("{") else re.escape(p)
        for p in parts
    )
    return re.compile(regex + "$")


def test_every_gateway_route_has_a_client_call() -> None:
    paths = create_app(GatewaySettings()).openapi()["paths"]
    routes = {
        (method.upper(), path)
        for path, item in paths.items()
        if path.startswith("/api/v1/") or path == "/readyz"
        for method in item
    }
    assert len(routes) > 60  # the document was read
    asked = _calls()
    assert ("POST", "/serve/x1/v1/models") in asked
    missing = sorted(
        (method, path)
        for method, path in routes
        if not any(m == method and _pattern(path).match(p) for m, p in asked)
    )
    assert not missing, f"routes without a call in heteroflow/client/routes.py: {missing}"
