"""Shedding against a real PostgreSQL: writes past the in-flight bound answered 503 at once
while reads are served, a tenant over its write rate answered 429, and a database that goes
away answered 503 within the wait bound, with the service back by itself when it returns."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import psycopg
import pytest
from prometheus_client import REGISTRY
from pydantic import SecretStr

from libs import auth
from libs.config import GatewaySettings
from libs.embedded import EmbeddedPostgres
from libs.store.eventstore import EventStore
from services.api_gateway.app import create_app
from tests.wait import wait_until_async

from . import web
from .helpers import bearer

pytestmark = pytest.mark.integration

TASK = {"name": "shed", "image": "busybox:latest"}
DEADLINE_S = 30.0
IN_FLIGHT_WRITES = "heteroflow_gateway_in_flight"


@asynccontextmanager
async def gateway(
    database_url: str, **settings: object
) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str], dict[str, str], EventStore]]:
    store = await EventStore.open(database_url, max_size=10)
    try:
        await auth.create_tenant(store, "acme", "Acme")
        await auth.create_tenant(store, "globex", "Globex")
        _, key = await auth.issue_api_key(store, "acme", "ci")
        _, other = await auth.issue_api_key(store, "globex", "ci")
        app = create_app(
            GatewaySettings(jwt_secret=SecretStr("s" * 32), **settings),  # type: ignore[arg-type]
            store,
        )
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gw", timeout=web.REQUEST
        ) as client:
            yield client, bearer(key), bearer(other), store
    finally:
        await store.close()


async def test_writes_past_the_bound_are_shed_at_once_reads_served_nothing_lost(
    database_url: str,
) -> None:
    async with gateway(database_url, max_inflight_writes=2) as (client, acme, _, store):
        assert (await client.post("/api/v1/tasks", json=TASK, headers=acme)).status_code == 201
        # Hold the event table: creates wait on the lock, in flight, while reads go on.
        async with await psycopg.AsyncConnection.connect(database_url) as locker:
            await locker.execute("LOCK TABLE events IN EXCLUSIVE MODE")
            held = [
                asyncio.create_task(client.post("/api/v1/tasks", json=TASK, headers=acme))
                for _ in range(2)
            ]

            async def both_in_flight() -> bool:
                return (REGISTRY.get_sample_value(IN_FLIGHT_WRITES, {"kind": "write"}) or 0) >= 2

            await wait_until_async(
                both_in_flight, DEADLINE_S, 0.02, "two creates in flight behind the lock"
            )
            assert not any(h.done() for h in held)
            started = time.monotonic()
            shed = await client.post("/api/v1/tasks", json=TASK, headers=acme)
            assert time.monotonic() - started < 1.0
            assert shed.status_code == 503, shed.text
            assert shed.headers["retry-after"] == "1" and shed.json()["code"] == 50301
            listed = await client.get("/api/v1/tasks", headers=acme)
            assert listed.status_code == 200, listed.text
            await locker.rollback()
        answers = await asyncio.gather(*held)
        assert [a.status_code for a in answers] == [201, 201]
        listed = (await client.get("/api/v1/tasks", headers=acme)).json()
        ids = {t["id"] for t in listed["tasks"]}
        assert {a.json()["id"] for a in answers} <= ids


async def test_a_tenant_over_its_write_rate_gets_429_and_others_go_on(database_url: str) -> None:
    async with gateway(database_url, tenant_write_rate_per_s=0.01, tenant_write_burst=2) as (
        client,
        acme,
        globex,
        _,
    ):
        got = [
            (await client.post("/api/v1/tasks", json=TASK, headers=acme)).status_code
            for _ in range(2)
        ]
        assert got == [201, 201]
        over = await client.post("/api/v1/tasks", json=TASK, headers=acme)
        assert over.status_code == 429, over.text
        assert over.json()["code"] == 42901 and "0.01/s" in over.json()["error"]
        assert int(over.headers["retry-after"]) >= 1
        assert (await client.post("/api/v1/tasks", json=TASK, headers=globex)).status_code == 201
        assert (await client.get("/api/v1/tasks", headers=acme)).status_code == 200  # reads free
        listed = (await client.get("/api/v1/tasks", headers=acme)).json()
        assert len(listed["tasks"]) == 2  # the refused create left nothing behind


# The gateway's wait for a connection, and what a loaded machine may add to it: the bound
# is told apart from the pool's own 30 s, not timed to the tenth (3.2 s was seen on a busy
# 2-core runner with a 2 s wait and 1 s of slack).
DB_WAIT_S = 1.0
SLACK_S = 4.0


@pytest.mark.slow
async def test_with_the_database_gone_requests_are_503_within_the_bound_then_recover() -> None:
    root = Path(tempfile.mkdtemp(prefix="hf-pgdown-"))
    pg = EmbeddedPostgres(root / "pg").start()
    try:
        url = pg.url
        async with gateway(url, db_wait_timeout_s=DB_WAIT_S) as (client, acme, _, _store):
            assert (await client.post("/api/v1/tasks", json=TASK, headers=acme)).status_code == 201
            ready = await client.get("/readyz")
            assert ready.status_code == 200 and ready.json()["checks"]["postgres"] == "ok"
            pg.stop()
            started = time.monotonic()
            ready = await client.get("/readyz")
            assert ready.status_code == 503 and ready.json()["checks"]["postgres"] != "ok"
            assert time.monotonic() - started < DB_WAIT_S + SLACK_S
            for method in ("GET", "POST"):
                started = time.monotonic()
                r = await client.request(
                    method, "/api/v1/tasks", json=TASK if method == "POST" else None, headers=acme
                )
                took = time.monotonic() - started
                assert r.status_code == 503, (method, r.status_code, r.text)
                assert r.json()["code"] == 50302 and r.headers["retry-after"] == "2"
                assert took < DB_WAIT_S + SLACK_S, f"{method} took {took:.1f} s"
            pg = EmbeddedPostgres(root / "pg").start()
            assert pg.url == url  # same socket, same data

            async def served() -> bool:
                r = await client.post("/api/v1/tasks", json=TASK, headers=acme)
                return r.status_code == 201

            await wait_until_async(
                served, DEADLINE_S, 0.02, "a create served after the database came back"
            )
            assert (await client.get("/readyz")).json() == {
                "status": "ok",
                "checks": {"postgres": "ok", "disk_space": "ok"},
            }
            listed = (await client.get("/api/v1/tasks", headers=acme)).json()
            assert len(listed["tasks"]) == 2  # the first create survived; the refused left none
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)
