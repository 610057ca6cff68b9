"""The committed OpenAPI document matches the code (regenerate with `just openapi`)."""

from __future__ import annotations

import json
from pathlib import Path

from services.api_gateway.openapi import render

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def test_committed_openapi_matches_code() -> None:
    assert COMMITTED.read_text() == render(), "docs/openapi.json is stale: run `just openapi`"


def test_openapi_lists_the_task_endpoints() -> None:
    paths = json.loads(COMMITTED.read_text())["paths"]
    for path in (
        "/api/v1/tasks",
        "/api/v1/tasks/{task_id}",
        "/api/v1/tasks/stats",
        "/api/v1/tenants",
        "/api/v1/tenants/{tenant_id}/api-keys",
        "/healthz",
    ):
        assert path in paths


def _refs(node: object) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(_refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node))
    return set()


def test_every_reference_resolves_in_the_document() -> None:
    doc = json.loads(COMMITTED.read_text())
    schemas = doc["components"]["schemas"]
    refs = _refs(doc)
    assert refs, "the document references its schemas"
    assert all(r.startswith("#/components/schemas/") for r in refs), refs
    assert {r.removeprefix("#/components/schemas/") for r in refs} <= set(schemas)


def test_each_operation_documents_the_errors_it_answers() -> None:
    paths = json.loads(COMMITTED.read_text())["paths"]
    create = paths["/api/v1/tasks"]["post"]["responses"]
    assert {"201", "400", "401", "403", "413", "415", "429", "500", "503"} <= set(create)
    assert "Retry-After" in create["503"]["headers"] and "Retry-After" in create["429"]["headers"]
    one = paths["/api/v1/tasks/{task_id}"]["get"]["responses"]
    assert {"200", "404", "401"} <= set(one) and "429" not in one
    assert all("422" not in op["responses"] for item in paths.values() for op in item.values())


async def test_a_wrong_method_is_405_naming_every_method_of_the_path() -> None:
    import httpx

    from libs.config import GatewaySettings
    from services.api_gateway.app import create_app

    app = create_app(GatewaySettings(), store=None)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        r = await client.patch("/api/v1/tasks")
        assert r.status_code == 405
        assert r.headers["allow"] == "GET, HEAD, POST"
        assert r.json()["code"] == 40500 and "PATCH" in r.json()["error"]
        r = await client.request("TRACE", "/api/v1/tasks/task-1")
        assert r.headers["allow"] == "DELETE, GET, HEAD, PUT"
