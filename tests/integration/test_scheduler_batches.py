"""The scheduler's batched consumers against a real PostgreSQL and a real JetStream: a batch of
agent reports in one transaction with a compare-and-set per report, and a batch of
transitions turned into commands published pipelined, in order."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
import structlog.testing
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig

from libs.bus import subjects as s
from libs.bus.nats import connect, ensure_streams
from libs.domain.envelope import EventEnvelope
from libs.domain.protocol import AgentReport, CommandKind, Fact, NodeCommand, NodeReport
from libs.domain.reasons import ReasonCode
from libs.domain.task.decide import decide_transition
from libs.domain.task.events import TaskStatusChanged
from libs.domain.task.model import Task, TaskSpec, TenantId
from libs.domain.task.states import Actor, TaskStatus
from libs.store.eventstore import KNOWN_WRITES, EventStore
from services.scheduler.handlers.dispatch import Dispatcher
from services.scheduler.handlers.reports import ReportHandler

pytestmark = pytest.mark.integration

S = TaskStatus
T = TenantId("acme")


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[EventStore]:
    st = await EventStore.open(database_url, max_size=4)
    yield st
    await st.close()


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    client = await connect(nats_url, "test-scheduler-batches")
    await ensure_streams(client.jetstream())
    yield client
    await client.close()


@pytest.fixture
def node() -> str:
    return "n" + uuid.uuid4().hex[:10]  # the node stream is shared by the session's tests


async def placed(store: EventStore, node: str, to: TaskStatus = S.SCHEDULED) -> Task:
    task = await store.create_task(T, TaskSpec(name="t", image="busybox", gpu_required=1))
    task = await store.execute(
        task.id,
        lambda t: decide_transition(
            t,
            S.SCHEDULED,
            actor=Actor.SCHEDULER,
            reason_code=ReasonCode.PLACED,
            node_id=node,
            gpu_ids=(f"{node}-g0",),
        ),
    )
    if to is not S.SCHEDULED:
        task = await store.execute(
            task.id,
            lambda t: decide_transition(
                t,
                to,
                actor=Actor.AGENT if to is S.RUNNING else Actor.OPERATOR,
                report=to is S.RUNNING,
                reason_code=ReasonCode.REPORTED,
            ),
        )
    return task


def report(node: str, task_id: str, fact: Fact, expected: TaskStatus, **kw: Any) -> NodeReport:
    rep = AgentReport(
        node_id=node,
        task_id=task_id,
        attempt=0,
        fact=fact,
        expected_status=expected,
        at=datetime.now(UTC),
        **kw,
    )
    return NodeReport(rep)


def known_batches(outcome: str) -> float:
    return float(KNOWN_WRITES.labels(outcome)._value.get())


async def statuses(store: EventStore, task_id: str) -> list[str]:
    return [e.payload["to_status"] for e in await store.read_stream(task_id) if e.version > 1]


async def commands(js: JetStreamContext, node: str) -> list[NodeCommand]:
    sub = await js.pull_subscribe(
        s.node_command_subject(node),
        stream=s.NODE_STREAM,
        config=ConsumerConfig(inactive_threshold=10.0),
    )
    found: list[NodeCommand] = []
    while (await sub.consumer_info()).num_pending:
        found += [NodeCommand.model_validate_json(m.data) for m in await sub.fetch(100, timeout=1)]
    await sub.unsubscribe()
    return found


async def test_a_batch_of_reports_commits_in_order_with_a_cas_each(
    store: EventStore, nc: Client, node: str
) -> None:
    a = await placed(store, node)
    b = await placed(store, node, S.STOPPING)
    batch = [
        report(node, a.id, Fact.STARTING, S.SCHEDULED),
        report(node, a.id, Fact.RUNNING, S.STARTING, container_id="c1"),
        # Stale (the task is stopping): refused alone, then applied from the current status.
        report(node, b.id, Fact.EXITED, S.RUNNING, exit_code=0),
        report(node, "task-unknown", Fact.RUNNING, S.STARTING),
    ]
    outcomes = await ReportHandler(store, nc.jetstream()).handle_batch(batch)
    assert outcomes == [None, None, None, None]
    assert await statuses(store, a.id) == ["scheduled", "starting", "running"]
    assert await statuses(store, b.id) == ["scheduled", "stopping", "stopped"]
    events = await store.read_stream(a.id)
    assert [e.metadata.get("fact") for e in events[2:]] == ["starting", "running"]


async def test_twenty_terminal_reports_in_one_batch_make_one_transition(
    store: EventStore, nc: Client, node: str
) -> None:
    task = await placed(store, node, S.RUNNING)
    batch = [report(node, task.id, Fact.EXITED, S.RUNNING, exit_code=0) for _ in range(20)]
    outcomes = await ReportHandler(store, nc.jetstream()).handle_batch(batch)
    assert outcomes == [None] * 20
    assert await statuses(store, task.id) == ["scheduled", "running", "completed"]


async def test_an_orphan_container_is_told_to_stop(
    store: EventStore, nc: Client, node: str
) -> None:
    task = await placed(store, node)
    other = "n" + uuid.uuid4().hex[:10]
    outcomes = await ReportHandler(store, nc.jetstream()).handle_batch(
        [report(other, task.id, Fact.RUNNING, S.STARTING)]
    )
    assert outcomes == [None]
    sent = await commands(nc.jetstream(), other)
    assert [(c.kind, c.task_id) for c in sent] == [(CommandKind.STOP, task.id)]
    assert await statuses(store, task.id) == ["scheduled"]


def envelope(task: Task, to: TaskStatus) -> EventEnvelope:
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
            from_status=S.PENDING,
            to_status=to,
            actor="scheduler",
            reason_code=ReasonCode.PLACED,
        ).model_dump(mode="json"),
    )


async def test_a_batch_of_transitions_becomes_commands_in_order(
    store: EventStore, nc: Client, node: str
) -> None:
    js = nc.jetstream()
    tasks = [await placed(store, node) for _ in range(5)]
    stopping = await placed(store, node, S.STOPPING)
    batch = [envelope(t, S.SCHEDULED) for t in tasks]
    # A stale start (the task moved on to stopping) sends nothing; its stop goes out.
    batch += [envelope(stopping, S.SCHEDULED), envelope(stopping, S.STOPPING)]
    outcomes = await Dispatcher(store, js).handle_batch(batch)
    assert outcomes == [None] * len(batch)
    sent = await commands(js, node)
    assert [(c.kind, c.task_id) for c in sent] == [
        *((CommandKind.START, t.id) for t in tasks),
        (CommandKind.STOP, stopping.id),
    ]
    assert all(c.run is not None and c.run.gpu_ids == (f"{node}-g0",) for c in sent[:5])


async def test_a_report_stale_only_on_the_held_document_is_not_logged_stale(
    store: EventStore, nc: Client, node: str, database_url: str
) -> None:
    """The store decides a batch first on the documents it holds (eventstore `_known_steps`):
    a report that is stale against the held document but current on the row is written from
    the row, and only a report stale on the row is logged as `stale_report_refused`."""
    task = await store.create_task(T, TaskSpec(name="t", image="busybox", gpu_required=1))
    done, _ = await store.execute_batch(  # this store now holds the task at `scheduled`
        {
            task.id: lambda t: decide_transition(
                t,
                S.SCHEDULED,
                actor=Actor.SCHEDULER,
                reason_code=ReasonCode.PLACED,
                node_id=node,
                gpu_ids=(f"{node}-g0",),
            )
        }
    )
    assert task.id in done
    other = await EventStore.open(database_url, max_size=1)  # another process: starting
    try:
        await ReportHandler(other, nc.jetstream()).handle_batch(
            [report(node, task.id, Fact.STARTING, S.SCHEDULED)]
        )
    finally:
        await other.close()
    stopping = await placed(store, node, S.STOPPING)
    handler = ReportHandler(store, nc.jetstream())
    moved = known_batches("moved")
    with structlog.testing.capture_logs() as logs:
        running = [report(node, task.id, Fact.RUNNING, S.STARTING, container_id="c1")]
        assert await handler.handle_batch(running) == [None]
        assert known_batches("moved") == moved + 1  # decided on the held document first
        stale_on_row = [report(node, stopping.id, Fact.EXITED, S.RUNNING, exit_code=0)]
        assert await handler.handle_batch(stale_on_row) == [None]
    assert await statuses(store, task.id) == ["scheduled", "starting", "running"]
    assert await statuses(store, stopping.id) == ["scheduled", "stopping", "stopped"]
    stale = [e["task_id"] for e in logs if e["event"] == "stale_report_refused"]
    assert stale == [stopping.id]
