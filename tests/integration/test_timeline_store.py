"""Timeline storage against a real PostgreSQL: cap of 200 per subject, 30-day purge,
a handled event written once, newest-first reads."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

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
