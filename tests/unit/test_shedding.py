"""Shedding and tenant rates as pure logic: the in-flight bounds per class of request, the
slot given back when the answer starts, and the token bucket with an injected clock."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import httpx
import pytest

from libs import auth
from libs.domain.errors import Code, Throttled
from services.api_gateway.shedding import Shedding, TenantRates
from tests.wait import wait_until_async


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("rate", "burst", "steps", "expected"),
    [
        # (seconds to advance before each take, whether it is allowed)
        (1.0, 2, [0, 0, 0], [True, True, False]),
        (1.0, 2, [0, 0, 0, 1.0], [True, True, False, True]),
        (10.0, 1, [0, 0, 0.05, 0.06], [True, False, False, True]),
        (0.0, 1, [0, 0, 0, 0], [True, True, True, True]),  # 0: unlimited
        (2.0, 3, [0, 0, 0, 0, 100.0, 0, 0, 0], [True, True, True, False, True, True, True, False]),
    ],
    ids=["burst", "refill", "fraction", "unlimited", "burst-caps-savings"],
)
def test_token_bucket(rate: float, burst: int, steps: list[float], expected: list[bool]) -> None:
    clock = Clock()
    rates = TenantRates(rate, burst, clock)
    got = []
    for step in steps:
        clock.now += step
        try:
            rates.take("acme")
            got.append(True)
        except Throttled:
            got.append(False)
    assert got == expected


def test_a_refusal_names_the_rate_and_when_to_retry() -> None:
    rates = TenantRates(0.5, 1, Clock())
    rates.take("acme")
    with pytest.raises(Throttled) as caught:
        rates.take("acme")
    assert caught.value.code is Code.TOO_MANY_REQUESTS and caught.value.http_status == 429
    assert "0.5/s" in caught.value.message and "acme" in caught.value.message
    assert caught.value.retry_after_s == 2


def test_tenants_have_their_own_buckets() -> None:
    rates = TenantRates(1.0, 1, Clock())
    rates.take("acme")
    rates.take("globex")
    with pytest.raises(Throttled):
        rates.take("acme")


class Held:
    """An ASGI app whose answers wait until released; counts what reached it."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.entered += 1
        if scope["path"] == "/stream":
            # Headers first, then the body much later: a stream gives its slot back at once.
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await self.release.wait()
            await send({"type": "http.response.body", "body": b"end"})
            return
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def test_writes_over_the_bound_are_503_at_once_and_reads_keep_their_room() -> None:
    app = Held()
    shed = Shedding(app, max_reads=2, max_writes=2, db_wait_s=2.0)
    transport = httpx.ASGITransport(app=shed)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        held = [asyncio.create_task(client.post("/w", json={})) for _ in range(2)]
        await wait_until_async(lambda: app.entered >= 2, 10, 0.001)
        over = await client.post("/w", json={})
        assert over.status_code == 503 and over.headers["retry-after"] == "1"
        assert over.json()["code"] == Code.OVERLOADED
        assert app.entered == 2  # the refused one did no work
        read = asyncio.create_task(client.get("/r"))
        health = asyncio.create_task(client.get("/healthz"))  # never shed
        await wait_until_async(lambda: app.entered >= 4, 10, 0.001)
        app.release.set()
        assert (await health).status_code == 200
        assert (await read).status_code == 200
        assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200]
        assert shed.in_flight == {"read": 0, "write": 0}
        assert (await client.post("/w", json={})).status_code == 200


async def test_a_stream_gives_its_slot_back_when_its_answer_starts() -> None:
    app = Held()
    shed = Shedding(app, max_reads=1, max_writes=1, db_wait_s=2.0)
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    def call(path: str) -> Any:
        scope = {"type": "http", "method": "GET", "path": path, "headers": []}
        return asyncio.create_task(shed(scope, receive, send))

    stream = call("/stream")
    await wait_until_async(lambda: bool(sent), 10, 0.001)
    assert shed.in_flight["read"] == 0  # headers sent: the slot is free, the body still open
    second = call("/r")
    await wait_until_async(lambda: app.entered >= 2, 10, 0.001)
    app.release.set()
    await asyncio.gather(stream, second)
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [200, 200]


async def test_routed_inference_traffic_is_not_counted() -> None:
    app = Held()
    shed = Shedding(app, max_reads=1, max_writes=1, db_wait_s=2.0)
    transport = httpx.ASGITransport(app=shed)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        held = [asyncio.create_task(client.post("/serve/g1/v1/completions")) for _ in range(3)]
        await wait_until_async(lambda: app.entered >= 3, 10, 0.001)  # all three reached the router
        assert shed.in_flight == {"read": 0, "write": 0}
        app.release.set()
        assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200, 200]


async def test_a_known_tenant_over_its_rate_is_refused_before_the_application() -> None:
    app = Held()
    app.release.set()
    clock = Clock()
    rates = TenantRates(1.0, 1, clock)
    cache = auth.CredentialCache(60.0)
    key, operator_key, unknown_key = "hf_tenantkey", "hf_operatorkey", "hf_notcachedyet"
    cache.put(auth.hash_key(key), auth.Principal(auth.Role.TENANT_KEY, "k1", "t1"))
    cache.put(auth.hash_key(operator_key), auth.Principal(auth.Role.OPERATOR, "op"))
    shed = Shedding(app, 8, 8, 2.0, rates=rates, credentials=cache)
    transport = httpx.ASGITransport(app=shed)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:

        def post(token: str) -> Any:
            return client.post("/w", json={}, headers={"Authorization": f"Bearer {token}"})

        assert (await post(key)).status_code == 200  # a token left: the application decides
        rates.take("t1")  # what the application's rate dependency spends
        over = await post(key)
        assert over.status_code == 429 and over.headers["retry-after"] == "1"
        assert over.json()["code"] == Code.TOO_MANY_REQUESTS and "t1" in over.json()["error"]
        assert app.entered == 1  # the refusal did no work
        assert (await client.get("/r", headers={"Authorization": f"Bearer {key}"})).is_success
        assert (await post(operator_key)).status_code == 200  # not a tenant: no tenant rate
        assert (await post(unknown_key)).status_code == 200  # not known yet: authenticated there
        assert app.entered == 4
        clock.now += 1.0
        assert (await post(key)).status_code == 200  # refilled: nothing was spent early
