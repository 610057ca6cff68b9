"""The committed OpenAPI document matches the code (regenerate with `just openapi`)."""

from __future__ import annotations

from pathlib import Path

from services.api_gateway.openapi import render

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def test_committed_openapi_matches_code() -> None:
    assert COMMITTED.read_text() == render(), "docs/openapi.json is stale: run `just openapi`"


def test_openapi_lists_the_task_endpoints() -> None:
    paths = __import__("json").loads(COMMITTED.read_text())["paths"]
    for path in (
        "/api/v1/tasks",
        "/api/v1/tasks/{task_id}",
        "/api/v1/tasks/stats",
        "/api/v1/tenants",
        "/api/v1/tenants/{tenant_id}/api-keys",
        "/healthz",
    ):
        assert path in paths
