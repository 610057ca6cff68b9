"""Helpers shared by gateway tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx

from libs import auth
from libs.config import GatewaySettings
from libs.domain.envelope import EventEnvelope
from libs.domain.reasons import ReasonCode
from libs.domain.task.decide import decide_transition
from libs.domain.task.states import Actor, TaskStatus
from libs.store.eventstore import EventStore
from services.api_gateway.app import create_app

from . import web


@dataclass
class Api:
    client: httpx.AsyncClient
    store: EventStore
    operator: dict[str, str]
    tenant: dict[str, str]
    other_tenant: dict[str, str]
    agent: dict[str, str]  # the agent key of node AGENT_NODE
    settings: GatewaySettings

    async def place(self, task_id: str, node_id: str = "n1") -> None:
        """Put a pending task on `node_id` as the scheduler would (an operator report), so
        that node's agent key may report on it."""
        r = await self.client.put(
            f"/api/v1/tasks/{task_id}",
            json={"status": "scheduled", "node_id": node_id},
            headers=self.operator,
        )
        assert r.status_code == 200, r.text


AGENT_NODE = "n1"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def complete(store: EventStore, task_id: str, result: str) -> EventEnvelope:
    """Walk a pending task to `completed` with `result`, as the scheduler and its agent
    would, and return its last event as the bus delivers it (the job orchestrator's input)."""
    for to in (TaskStatus.SCHEDULED, TaskStatus.STARTING, TaskStatus.RUNNING):
        await store.execute(
            task_id,
            partial(decide_transition, to=to, actor=Actor.SCHEDULER, reason_code=ReasonCode.PLACED),
        )
    await store.execute(
        task_id,
        partial(
            decide_transition,
            to=TaskStatus.COMPLETED,
            actor=Actor.AGENT,
            reason_code=ReasonCode.EXITED,
            exit_code=0,
            result=result,
        ),
    )
    return (await store.read_stream(task_id))[-1]


@contextlib.asynccontextmanager
async def gateway_api(
    store: EventStore, settings: GatewaySettings, nc: Any = None
) -> AsyncIterator[Api]:
    """The gateway app over `store` (and bus connection `nc`, if any), with an operator, an
    agent and two tenants' keys."""
    op = await auth.issue_system_credential(store, "operator", "root")
    agent = await auth.issue_node_credential(store, AGENT_NODE)
    await auth.create_tenant(store, "acme", "Acme")
    await auth.create_tenant(store, "globex", "Globex")
    _, key = await auth.issue_api_key(store, "acme", "ci")
    _, other = await auth.issue_api_key(store, "globex", "ci")
    app = create_app(settings, store, nc) if nc is not None else create_app(settings, store)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://gw", timeout=web.REQUEST
    ) as client:
        yield Api(client, store, bearer(op), bearer(key), bearer(other), bearer(agent), settings)
