"""One tenant's share of the write slots: a known tenant holding its share is refused 503
while another tenant's write still finds a slot; the share is given back with the answer."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from libs import auth
from libs.domain.errors import Code
from services.api_gateway.shedding import Shedding
from tests.unit.test_shedding import Held
from tests.wait import wait_until_async

KEYS = {"acme": "hf_acmekey", "globex": "hf_globexkey"}


def _cache() -> auth.CredentialCache:
    cache = auth.CredentialCache(60.0)
    for tenant, key in KEYS.items():
        cache.put(auth.hash_key(key), auth.Principal(auth.Role.TENANT_KEY, f"k-{tenant}", tenant))
    return cache


@pytest.mark.parametrize(
    ("bound", "configured", "share"),
    [(4, 0, 3), (64, 0, 48), (4, 1, 1), (3, 0, 0), (0, 0, 0)],
    ids=["default-4", "default-64", "configured", "under-4-no-share", "unbounded"],
)
def test_the_share_is_three_quarters_of_the_bound_unless_configured_or_small(
    bound: int, configured: int, share: int
) -> None:
    shed = Shedding(Held(), 8, bound, 2.0, credentials=_cache(), max_writes_per_tenant=configured)
    assert shed.tenant_share == share


async def test_a_tenant_holding_its_share_is_refused_while_another_is_served() -> None:
    app = Held()
    shed = Shedding(app, max_reads=8, max_writes=4, db_wait_s=2.0, credentials=_cache())
    transport = httpx.ASGITransport(app=shed)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:

        def post(tenant: str) -> Any:
            headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
            return client.post("/w", json={}, headers=headers)

        held = [asyncio.create_task(post("acme")) for _ in range(3)]
        await wait_until_async(lambda: app.entered >= 3, 10, 0.001)
        try:
            # An answer at once: admitted, it would wait for the release like the others.
            over = await asyncio.wait_for(post("acme"), 10)
        except TimeoutError:
            pytest.fail("acme's fourth write was admitted past its share of 3")
        assert over.status_code == 503 and over.headers["retry-after"] == "1"
        assert over.json()["code"] == Code.OVERLOADED and "acme" in over.json()["error"]
        other = asyncio.create_task(post("globex"))  # the fourth slot is still the others'
        await wait_until_async(lambda: app.entered >= 4, 10, 0.001)
        app.release.set()
        answers = await asyncio.gather(*held, other)
        assert [r.status_code for r in answers] == [200] * 4
    assert shed.tenant_writes == {} and shed.in_flight["write"] == 0
