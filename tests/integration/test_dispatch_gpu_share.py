"""A fraction's start carries the share the scheduler counted on its card, read from the node's
inventory in a real PostgreSQL and published on a real JetStream, batched or one by one."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from nats.aio.client import Client
from nats.js.api import ConsumerConfig

from libs.bus import subjects as s
from libs.bus.nats import connect, ensure_streams
from libs.domain.envelope import EventEnvelope
from libs.domain.node.events import NodeRegistered
from libs.domain.node.model import GpuCard, NodeInventory
from libs.domain.protocol import GpuShare, NodeCommand
from libs.domain.reasons import ReasonCode
from libs.domain.task.decide import decide_transition
from libs.domain.task.events import TaskStatusChanged
from libs.domain.task.model import Task, TaskSpec, TenantId
from libs.domain.task.states import Actor, TaskStatus
from libs.store.eventstore import EventStore
from libs.store.projections import NODES
from services.scheduler.handlers.dispatch import Dispatcher

pytestmark = pytest.mark.integration

CARD_MB = 81_920


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[EventStore]:
    st = await EventStore.open(database_url, max_size=4)
    yield st
    await st.close()


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    client = await connect(nats_url, "test-dispatch-gpu-share")
    await ensure_streams(client.jetstream())
    yield client
    await client.close()


async def node_with_a_card(store: EventStore) -> tuple[str, str]:
    node = "n" + uuid.uuid4().hex[:10]  # the node stream is shared by the session's tests
    card = GpuCard(id=f"{node}-g0", index=0, vendor="nvidia", model="A100", vram_mb=CARD_MB)
    inventory = NodeInventory(memory_mb=65_536, cpu_cores=16, gpus=(card,))
    ev = NodeRegistered(node_id=node, inventory=inventory)
    await store.execute_aggregate(NODES, node, lambda _n: [ev])
    return node, card.id


async def placed(store: EventStore, node: str, card: str, spec: TaskSpec) -> Task:
    task = await store.create_task(TenantId("acme"), spec)
    return await store.execute(
        task.id,
        lambda t: decide_transition(
            t,
            TaskStatus.SCHEDULED,
            actor=Actor.SCHEDULER,
            reason_code=ReasonCode.PLACED,
            node_id=node,
            gpu_ids=(card,),
            qos="silver",
        ),
    )


def scheduled(task: Task) -> EventEnvelope:
    return EventEnvelope(
        event_id=uuid.uuid4(),
        position=1,
        stream_id=task.id,
        stream_type="task",
        version=task.version,
        type="task_status_changed",
        occurred_at=datetime.now(UTC),
        payload=TaskStatusChanged(
            task_id=task.id,
            from_status=TaskStatus.PENDING,
            to_status=TaskStatus.SCHEDULED,
            actor="scheduler",
            reason_code=ReasonCode.PLACED,
        ).model_dump(mode="json"),
    )


async def starts(nc: Client, node: str) -> dict[str, NodeCommand]:
    js = nc.jetstream()
    sub = await js.pull_subscribe(
        s.node_command_subject(node),
        stream=s.NODE_STREAM,
        config=ConsumerConfig(inactive_threshold=10.0),
    )
    found: list[NodeCommand] = []
    while (await sub.consumer_info()).num_pending:
        found += [NodeCommand.model_validate_json(m.data) for m in await sub.fetch(100, timeout=1)]
    await sub.unsubscribe()
    return {c.task_id: c for c in found}


async def test_a_batch_of_starts_carries_each_fractions_counted_share(
    store: EventStore, nc: Client
) -> None:
    node, card = await node_with_a_card(store)
    ratio = await placed(store, node, card, TaskSpec(name="r", image="i", gpu_compute_ratio=0.25))
    mb = await placed(store, node, card, TaskSpec(name="m", image="i", gpu_memory_mb=16_384))
    whole = await placed(store, node, card, TaskSpec(name="w", image="i", gpu_required=1))
    batch = [scheduled(t) for t in (ratio, mb, whole)]
    assert await Dispatcher(store, nc.jetstream()).handle_batch(batch) == [None] * 3
    sent = await starts(nc, node)
    shares = {task_id: cmd.run.gpu_share if cmd.run else None for task_id, cmd in sent.items()}
    assert shares == {
        ratio.id: GpuShare(gpu_id=card, memory_mb=20_480, compute_ratio=0.25),
        mb.id: GpuShare(gpu_id=card, memory_mb=16_384, compute_ratio=0.2),
        whole.id: None,
    }


async def test_a_single_start_carries_the_share_too(store: EventStore, nc: Client) -> None:
    node, card = await node_with_a_card(store)
    task = await placed(store, node, card, TaskSpec(name="r", image="i", gpu_compute_ratio=0.5))
    await Dispatcher(store, nc.jetstream()).handle(scheduled(task))
    run = (await starts(nc, node))[task.id].run
    assert run is not None
    assert run.gpu_share == GpuShare(gpu_id=card, memory_mb=40_960, compute_ratio=0.5)
