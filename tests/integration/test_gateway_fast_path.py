"""What the gateway's fast path must keep: a revoked key stops working within the
credential cache's TTL (and at once with the cache off), and a body the fast JSON parser
refuses is answered exactly as the standard parser would answer it."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from pydantic import SecretStr

from libs import auth
from libs.config import GatewaySettings
from libs.domain.task.model import TenantId
from libs.domain.tenant.events import ApiKeyRevoked
from libs.store.eventstore import EventStore
from services.api_gateway.app import create_app

from . import web

pytestmark = pytest.mark.integration

BODY = {"name": "x", "image": "busybox:latest"}


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[EventStore]:
    store = await EventStore.open(database_url)
    await auth.create_tenant(store, "acme", "Acme")
    yield store
    await store.close()


def client_for(store: EventStore, ttl_s: float) -> httpx.AsyncClient:
    settings = GatewaySettings(
        jwt_secret=SecretStr("test-secret-0123456789abcdef0123456789"), auth_cache_ttl_s=ttl_s
    )
    transport = httpx.ASGITransport(app=create_app(settings, store))
    return httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=web.REQUEST)


async def revoke(store: EventStore, key_id: str) -> None:
    await store.append_stream(
        "tenant-acme", [ApiKeyRevoked(key_id=key_id, tenant_id=TenantId("acme"))]
    )


async def test_revoked_key_stops_within_the_ttl(store: EventStore) -> None:
    ttl = 1.0
    key_id, key = await auth.issue_api_key(store, "acme", "ci")
    headers = {"Authorization": f"Bearer {key}"}
    async with client_for(store, ttl) as client:
        assert (await client.get("/api/v1/tasks", headers=headers)).status_code == 200
        await revoke(store, key_id)
        revoked_at = time.monotonic()
        # Still cached right after the revocation: this is the documented window.
        assert (await client.get("/api/v1/tasks", headers=headers)).status_code == 200
        # The key was cached before the revocation, so its entry is gone by `expired`: every
        # request started after that is refused, however long a request takes on a busy
        # machine (the bound is on when a request starts, not on how long the loop runs).
        expired = revoked_at + ttl
        after: list[httpx.Response] = []
        while not after:
            started = time.monotonic()
            r = await client.get("/api/v1/tasks", headers=headers)
            if started > expired:
                after.append(r)
        assert [(r.status_code, r.json()["code"]) for r in after] == [(401, 40101)]


async def test_without_cache_a_revoked_key_stops_at_once(store: EventStore) -> None:
    key_id, key = await auth.issue_api_key(store, "acme", "ci")
    headers = {"Authorization": f"Bearer {key}"}
    async with client_for(store, 0) as client:
        assert (await client.get("/api/v1/tasks", headers=headers)).status_code == 200
        await revoke(store, key_id)
        r = await client.get("/api/v1/tasks", headers=headers)
        assert r.status_code == 401 and r.json()["code"] == 40101


def standard_message(raw: bytes) -> str:
    try:
        json.loads(raw)
    except ValueError as exc:
        return f"request body is not valid JSON: {exc}"
    raise AssertionError("the standard parser accepts this body")


@pytest.mark.parametrize(
    "raw",
    # Bytes that are not UTF-8 are refused before parsing (test_gateway_limits.py).
    [b'{"name": }', b"{'name': 'x'}", b'{"name": "x",}'],
    ids=["missing value", "single quotes", "trailing comma"],
)
async def test_invalid_json_answered_as_the_standard_parser(store: EventStore, raw: bytes) -> None:
    _, key = await auth.issue_api_key(store, "acme", "ci")
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with client_for(store, 5) as client:
        r = await client.post("/api/v1/tasks", content=raw, headers=headers)
    assert r.status_code == 400
    assert r.json() == {"error": standard_message(raw), "code": 40003}


async def test_body_only_the_standard_parser_reads(store: EventStore) -> None:
    """An integer past 64 bits: orjson refuses it, the standard parser reads it, and the
    answer is the validation error it always was (not a JSON syntax error, not a 500)."""
    _, key = await auth.issue_api_key(store, "acme", "ci")
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    raw = b'{"name": "x", "image": "busybox:latest", "priority": 100000000000000000000000}'
    async with client_for(store, 5) as client:
        r = await client.post("/api/v1/tasks", content=raw, headers=headers)
    assert r.status_code == 400, r.text
    assert r.json()["code"] == 40003 and r.json()["fields"] == ["priority"]
