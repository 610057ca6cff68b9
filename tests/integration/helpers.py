"""Helpers shared by gateway tests."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import httpx

from libs.config import GatewaySettings
from libs.domain.envelope import EventEnvelope
from libs.domain.reasons import ReasonCode
from libs.domain.task.decide import decide_transition
from libs.domain.task.states import Actor, TaskStatus
from libs.store.eventstore import EventStore


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
