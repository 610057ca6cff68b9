"""The node monitor against a real PostgreSQL, with a test clock (no agent, no bus): on node
loss every GPU-holding task moves or ends in place, a pin survives a transient loss and is
dropped once the node is gone, and a task that lands on a lost node later is not stranded."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import pytest
from nats.aio.client import Client

from libs.domain.node.events import NodeRegistered
from libs.domain.node.model import NodeInventory
from libs.domain.reasons import ReasonCode
from libs.domain.task.decide import decide_transition
from libs.domain.task.model import Task, TaskSpec, TenantId
from libs.domain.task.states import Actor, TaskStatus
from libs.store.eventstore import EventStore
from libs.store.projections import NODES
from services.scheduler.controllers.node_monitor import NodeMonitor

pytestmark = pytest.mark.integration
S = TaskStatus
NODE = "n-mon"


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[EventStore]:
    st = await EventStore.open(database_url)
    yield st
    await st.close()


def step(to: TaskStatus, extra: dict[str, Any]) -> Callable[[Task], list[Any]]:
    def decide(t: Task) -> list[Any]:
        return list(
            decide_transition(
                t, to, actor=Actor.SCHEDULER, reason_code=ReasonCode.REPORTED, **extra
            )
        )

    return decide


async def move(store: EventStore, task_id: str, *path: TaskStatus, **fields: Any) -> None:
    for to in path:
        await store.execute(task_id, step(to, fields if to is S.SCHEDULED else {}))


async def task_on_node(store: EventStore, *path: TaskStatus) -> str:
    task = await store.create_task(TenantId("acme"), TaskSpec(name="t", image="busybox"))
    await move(store, task.id, S.SCHEDULED, *path, node_id=NODE)
    return task.id


async def status(store: EventStore, task_id: str) -> TaskStatus:
    return (await store.get_task(task_id)).status


async def test_node_loss_moves_or_ends_every_task_and_keeps_pins_until_gone(
    store: EventStore,
) -> None:
    inv = NodeInventory(memory_mb=65536, cpu_cores=16)
    await store.execute_aggregate(
        NODES, NODE, lambda _n: [NodeRegistered(node_id=NODE, inventory=inv)]
    )
    clock = [0.0]
    monitor = NodeMonitor(
        store, cast(Client, None), offline_after_s=10, gone_after_s=100, clock=lambda: clock[0]
    )
    monitor.since = 0.0
    running = await task_on_node(store, S.RUNNING)
    asleep = await task_on_node(store, S.RUNNING, S.SLEEPING)
    waking = await task_on_node(store, S.RUNNING, S.SLEEPING, S.WAKING)
    stopping = await task_on_node(store, S.RUNNING, S.STOPPING)
    draining = await task_on_node(store, S.RUNNING, S.DRAINING)
    pinned = await store.create_task(
        TenantId("acme"), TaskSpec(name="p", image="busybox", requested_node_id=NODE)
    )

    clock[0] = 11.0  # silent past the threshold: offline, not yet gone
    await monitor.tick()
    for task_id in (running, asleep, waking):
        moved = await store.get_task(task_id)
        assert moved.status is S.PENDING and moved.node_id is None, task_id
        assert moved.status_reason_code is ReasonCode.NODE_LOST
    assert await status(store, stopping) is S.STOPPED, "stopping ends in place"
    assert await status(store, draining) is S.CANCELLED, "draining ends in place"
    assert (await store.get_task(pinned.id)).spec.requested_node_id == NODE, "transient loss"

    # A write that lands on the node after its loss (a stop racing the monitor, a group
    # wake of a task it had not moved yet) is ended on the next evaluation, not left there.
    late = await task_on_node(store, S.RUNNING, S.STOPPING)
    clock[0] = 12.0
    await monitor.tick()
    assert await status(store, late) is S.STOPPED

    clock[0] = 111.0  # gone for good: only now does the pin go
    await monitor.tick()
    assert (await store.get_task(pinned.id)).spec.requested_node_id == ""
