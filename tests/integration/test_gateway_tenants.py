"""Tenant creation refusals found by schemathesis run as the operator: each a 4xx naming the
field, never the store's constraint error as a 500."""

from __future__ import annotations

import pytest

from .helpers import Api

pytestmark = pytest.mark.integration


async def test_a_name_another_tenant_has_is_409_naming_name(api: Api) -> None:
    for body in ({"id": "ini-1", "name": "Initrode"}, {"id": "ini-4"}):  # ini-4 is its name
        r = await api.client.post("/api/v1/tenants", json=body, headers=api.operator)
        assert r.status_code == 201, r.text
    for body in ({"id": "ini-2", "name": "Initrode"}, {"id": "ini-5", "name": "ini-4"}):
        r = await api.client.post("/api/v1/tenants", json=body, headers=api.operator)
        assert r.status_code == 409, r.text
        assert r.json()["code"] == 40901 and r.json()["fields"] == ["name"], r.json()
    listed = await api.client.get("/api/v1/tenants", headers=api.operator)
    ids = {t["id"] for t in listed.json()["tenants"]}
    assert {"ini-1", "ini-4"} <= ids and not {"ini-2", "ini-5"} & ids
