"""Timeline storage against a real PostgreSQL: cap of 200 per subject, 30-day purge,
a handled event written once, newest-first reads."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from libs.domain.envelope import EventEnvelope
from libs.domain.node.events import GpuLost
from libs.domain.reasons import ReasonCode
from libs.domain.task.decide import decide_transition
from libs.domain.task.model import Task, TaskSpec, TenantId
from libs.domain.task.states import Actor, TaskStatus
from libs.store.eventstore import EventStore
from libs.store.inbox import Receipt
from services.api_gateway.timeline import task_timeline
from services.event_timeline.rules import Entry
from services.event_timeline.service import Timeline

pytestmark = pytest.mark.integration
NOW = datetime.now(UTC)


@pytest.fixture
async def timeline(database_url: str) -> AsyncIterator[Timeline]:
    store = await EventStore.open(database_url)
    yield Timeline(store, retention=timedelta(days=30), cap=200)
    await store.close()


def receipt() -> Receipt:
    """A new event handled by the timeline consumer."""
    return Receipt("event-timeline", uuid.uuid4())


def entry(i: int, subject: str = "t1", age: timedelta = timedelta(0)) -> Entry:
    return Entry(
        id=f"00000000-0000-0000-0000-{i:012d}:task:{subject}",
        subject_type="task",
        subject_id=subject,
        kind="retry_escalation",
        message=f"entry {i}",
        occurred_at=NOW - age + timedelta(seconds=i),
        source_event=f"00000000-0000-0000-0000-{i:012d}",
    )


async def test_201st_entry_evicts_the_oldest(timeline: Timeline) -> None:
    await timeline.write([entry(i) for i in range(200)], receipt())
    await timeline.write([entry(200)], receipt())
    page = await task_timeline(timeline.store, "t1", 1, 200)
    assert page["total"] == 200
    messages = [e["message"] for e in page["events"]]
    assert messages[0] == "entry 200" and "entry 0" not in messages and "entry 1" in messages


async def test_a_handled_event_writes_nothing_again(timeline: Timeline) -> None:
    once = receipt()
    await timeline.write([entry(1), entry(2)], once)
    await timeline.write([entry(1), entry(2)], once)
    assert (await task_timeline(timeline.store, "t1", 1, 50))["total"] == 2


async def test_entries_older_than_30_days_are_purged(timeline: Timeline) -> None:
    await timeline.write(
        [entry(1, age=timedelta(days=31)), entry(2, age=timedelta(days=29))], receipt()
    )
    assert await timeline.purge() == 1
    page = await task_timeline(timeline.store, "t1", 1, 50)
    assert [e["message"] for e in page["events"]] == ["entry 2"]


async def test_cap_is_per_subject(timeline: Timeline) -> None:
    await timeline.write([entry(i) for i in range(150)], receipt())
    await timeline.write([entry(1000 + i, subject="t2") for i in range(150)], receipt())
    assert (await task_timeline(timeline.store, "t1", 1, 10))["total"] == 150
    assert (await task_timeline(timeline.store, "t2", 1, 10))["total"] == 150


def placed_on(node: str, card: str) -> Callable[[Task], list[Any]]:
    def decide(t: Task) -> list[Any]:
        return list(
            decide_transition(
                t,
                TaskStatus.SCHEDULED,
                actor=Actor.SCHEDULER,
                reason_code=ReasonCode.REPORTED,
                node_id=node,
                gpu_ids=(card,),
            )
        )

    return decide


async def test_gpu_lost_is_on_the_timeline_of_the_task_holding_the_card(
    timeline: Timeline,
) -> None:
    store = timeline.store
    spec = TaskSpec(name="holder", image="busybox", gpu_required=1)
    holder = await store.create_task(TenantId("acme"), spec)
    bystander = await store.create_task(TenantId("acme"), spec)
    for task, card in ((holder, "gpu-7"), (bystander, "gpu-8")):
        await store.execute(task.id, placed_on("n-gpu", card))
    lost = GpuLost(node_id="n-gpu", gpu_id="gpu-7", missed_heartbeats=3)
    await timeline.handle(
        EventEnvelope(
            event_id=uuid.uuid4(),
            position=1,
            stream_id="n-gpu",
            stream_type="node",
            version=2,
            type=lost.type,
            occurred_at=NOW,
            payload=lost.model_dump(mode="json"),
        )
    )
    page = await task_timeline(store, holder.id, 1, 50)
    assert [e["kind"] for e in page["events"]] == ["gpu_lost"]
    assert "gpu-7" in page["events"][0]["message"]
    assert "neither moved nor failed" in page["events"][0]["message"]
    assert (await task_timeline(store, bystander.id, 1, 50))["total"] == 0
