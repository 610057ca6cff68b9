"""Integration fixtures: a gateway app over a real store, with an operator and tenant keys."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from pydantic import SecretStr

from libs import auth
from libs.config import GatewaySettings
from libs.store.eventstore import EventStore
from services.api_gateway.app import create_app

from .helpers import Api, bearer


@pytest.fixture
async def api(database_url: str) -> AsyncIterator[Api]:
    store = await EventStore.open(database_url, max_size=30)
    settings = GatewaySettings(
        jwt_secret=SecretStr("test-secret-0123456789abcdef0123456789"),
        volume_allow_list=["/data", "/tmp/heteroflow"],
    )
    op = await auth.issue_system_credential(store, "operator", "root")
    agent = await auth.issue_system_credential(store, "agent", "agents")
    await auth.create_tenant(store, "acme", "Acme")
    await auth.create_tenant(store, "globex", "Globex")
    _, key = await auth.issue_api_key(store, "acme", "ci")
    _, other = await auth.issue_api_key(store, "globex", "ci")
    app = create_app(settings, store)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        yield Api(client, store, bearer(op), bearer(key), bearer(other), bearer(agent), settings)
    await store.close()
