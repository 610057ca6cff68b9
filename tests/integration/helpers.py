"""Helpers shared by gateway tests."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from libs.config import GatewaySettings
from libs.store.eventstore import EventStore


@dataclass
class Api:
    client: httpx.AsyncClient
    store: EventStore
    operator: dict[str, str]
    tenant: dict[str, str]
    other_tenant: dict[str, str]
    agent: dict[str, str]
    settings: GatewaySettings


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
