"""The batched commands (`execute_batch`, `execute_steps`) against a real PostgreSQL.

They run in pipeline mode: the inserts, upserts and COMMIT reach the server together, so an
insert's unique violation is only known at the commit. These check that a batch still
commits whole, refuses a CAS miss alone, and turns a stream written past the row lock into
a `Conflict` that leaves nothing written.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from libs import auth
from libs.domain.errors import Conflict, DomainError, NotFound
from libs.domain.reasons import ReasonCode
from libs.domain.task.decide import decide_delete, decide_pending_reason, decide_transition
from libs.domain.task.model import Task, TaskSpec, TenantId
from libs.domain.task.states import Actor, TaskStatus
from libs.domain.tenant.events import TenantUpdated
from libs.store import projections
from libs.store.eventstore import KNOWN_WRITES, EventStore
from libs.store.projections import TASKS

pytestmark = pytest.mark.integration

S = TaskStatus
T = TenantId("acme")


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[EventStore]:
    st = await EventStore.open(database_url, max_size=4)
    await auth.create_tenant(st, "acme", "Acme")
    yield st
    await st.close()


def place(expected: TaskStatus = S.PENDING) -> Any:
    def decide(t: Task) -> list[Any]:
        return list(
            decide_transition(
                t,
                S.SCHEDULED,
                actor=Actor.SCHEDULER,
                expected_status=expected,
                reason_code=ReasonCode.PLACED,
                reason="placed",
                node_id="n-1",
                gpu_ids=(),
            )
        )

    return decide


async def new_tasks(store: EventStore, n: int) -> list[str]:
    spec = TaskSpec(name="t", image="busybox")
    return [t.id for t in await store.create_tasks([(T, spec, None, None)] * n)]


async def test_a_batch_commits_together_and_refuses_a_cas_miss_alone(store: EventStore) -> None:
    ids = await new_tasks(store, 5)
    decisions = {i: place() for i in ids[:4]} | {ids[4]: place(expected=S.RUNNING)}
    done, refused = await store.execute_batch(decisions)
    assert sorted(done) == sorted(ids[:4]) and list(refused) == [ids[4]]
    for i in ids[:4]:
        task = await store.get_task(i)
        assert (task.status, task.node_id, task.version) == (S.SCHEDULED, "n-1", 2)
        assert done[i] == task  # what the batch returns is what the store holds
    assert (await store.get_task(ids[4])).version == 1
    assert len(await store.read_stream(ids[4])) == 1


async def test_steps_on_one_task_each_see_the_one_before(store: EventStore) -> None:
    (task_id,) = await new_tasks(store, 1)
    meta = {"node_id": "n-1", "fact": "x"}

    def why(text: str) -> Any:
        return lambda t: list(decide_pending_reason(t, ReasonCode.POOL_CAPACITY, text))

    steps = [(task_id, why("first"), meta), (task_id, why("second"), meta)]
    out = await store.execute_steps([*steps, ("task-missing", why("x"), meta)])
    assert [r.version for r in out[:2] if isinstance(r, Task)] == [2, 3]
    stored = await store.get_task(task_id)
    assert (stored.version, stored.pending_reason) == (3, "second")
    assert [e.metadata.get("fact") for e in await store.read_stream(task_id)][1:] == ["x", "x"]


async def test_a_stream_written_past_the_lock_makes_the_batch_a_conflict(
    store: EventStore, database_url: str
) -> None:
    ids = await new_tasks(store, 3)
    # A writer that skipped the row lock took version 2 of the middle task's stream.
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO events (event_id, stream_id, stream_type, version, type, payload,"
            " occurred_at) VALUES (%s, %s, 'task', 2, 'task_pending_reason', %s, now())",
            (uuid.uuid4(), ids[1], Jsonb({})),
        )
    with pytest.raises(Conflict):
        await store.execute_batch({i: place() for i in ids})
    for i in (ids[0], ids[2]):
        assert len(await store.read_stream(i)) == 1
        assert (await store.get_task(i)).status is S.PENDING


async def elsewhere(database_url: str, steps: list[Any]) -> list[Task | DomainError]:
    """`steps` written by another process's store (one that holds none of these documents)."""
    other = await EventStore.open(database_url, max_size=1)
    try:
        return await other.execute_steps(steps)
    finally:
        await other.close()


async def started_elsewhere(database_url: str, task_id: str) -> list[Task | DomainError]:
    """Another process's store moves the task to starting (an agent's report)."""
    start = partial(
        decide_transition, to=S.STARTING, actor=Actor.AGENT, reason_code=ReasonCode.REPORTED
    )
    return await elsewhere(database_url, [(task_id, lambda t: list(start(t)), None)])


def seen_by(into: list[Task]) -> Any:
    """A step that records the task it was given and changes nothing."""

    def decide(t: Task) -> list[Any]:
        into.append(t)
        return []

    return decide


async def test_a_batch_decides_on_what_this_store_committed_without_reading_it_back(
    store: EventStore, database_url: str
) -> None:
    (task_id,) = await new_tasks(store, 1)
    done, _ = await store.execute_batch({task_id: place()})
    # The row's document changed behind the store's back, its version did not: only a
    # batch that reads the row again sees the change.
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "UPDATE tasks SET doc = jsonb_set(doc, '{spec,name}', '\"changed\"') WHERE id = %s",
            (task_id,),
        )
    seen: list[Task] = []
    await store.execute_steps([(task_id, seen_by(seen), None)])
    # Decided on the held document, twice: a step that changes nothing is left to the
    # locked path, which finds the row at the held version and uses the document again.
    assert seen == [done[task_id]] * 2 and seen[0].spec.name == "t"


async def test_a_version_another_writer_committed_is_read_from_the_row(
    store: EventStore, database_url: str
) -> None:
    (task_id,) = await new_tasks(store, 1)
    await store.execute_batch({task_id: place()})
    moved = await started_elsewhere(database_url, task_id)
    seen: list[Task] = []
    await store.execute_batch({task_id: seen_by(seen)})
    # First on the held document (version 2); that step changes nothing, so the locked path
    # decides it again on the row, which another writer moved to version 3.
    assert [(t.version, t.status) for t in seen] == [(2, S.SCHEDULED), (3, S.STARTING)]
    assert seen[-1:] == moved


def recorded(into: list[Task], step: Any) -> Any:
    """`step`, recording each task it decides on."""

    def decide(t: Task) -> list[Any]:
        into.append(t)
        return list(step(t))

    return decide


def known_batches(outcome: str) -> float:
    return float(KNOWN_WRITES.labels(outcome)._value.get())


RUN = partial(decide_transition, to=S.RUNNING, actor=Actor.AGENT, reason_code=ReasonCode.REPORTED)


async def test_steps_on_held_documents_are_written_in_one_statement(
    store: EventStore, database_url: str
) -> None:
    ids = await new_tasks(store, 2)
    done, _ = await store.execute_batch({i: place() for i in ids})
    written = known_batches("written")
    seen: list[Task] = []
    out = await store.execute_steps([(i, recorded(seen, RUN), {"fact": "running"}) for i in ids])
    tasks = [t for t in out if isinstance(t, Task)]
    assert len(tasks) == len(out) and known_batches("written") == written + 1
    assert seen == [done[i] for i in ids]  # each decided once, on the held document
    assert [(t.version, t.status) for t in tasks] == [(3, S.RUNNING)] * 2
    for task in tasks:
        assert await store.get_task(task.id) == task
        (event,) = [e for e in await store.read_stream(task.id) if e.version == 3]
        assert event.payload["from_status"] == "scheduled" and event.metadata == {"fact": "running"}


async def test_a_held_document_that_moved_is_decided_again_on_the_row(
    store: EventStore, database_url: str
) -> None:
    (task_id,) = await new_tasks(store, 1)
    await store.execute_batch({task_id: place()})
    await started_elsewhere(database_url, task_id)
    moved = known_batches("moved")
    seen: list[Task] = []
    (out,) = await store.execute_steps([(task_id, recorded(seen, RUN), None)])
    assert isinstance(out, Task)
    # Decided on the held version 2, whose statement wrote nothing (the row was at 3); then
    # on the row, under its lock.
    assert known_batches("moved") == moved + 1
    assert [(t.version, t.status) for t in seen] == [(2, S.SCHEDULED), (3, S.STARTING)]
    assert (out.version, out.status) == (4, S.RUNNING)
    stream = await store.read_stream(task_id)
    assert [e.version for e in stream] == [1, 2, 3, 4]
    assert stream[-1].payload["from_status"] == "starting"


async def test_a_held_document_of_a_deleted_task_is_not_written_past_the_delete(
    store: EventStore, database_url: str
) -> None:
    (task_id,) = await new_tasks(store, 1)
    await store.execute_batch({task_id: place()})
    await elsewhere(database_url, [(task_id, lambda t: list(decide_delete(t, Actor.TENANT)), None)])
    versions = [e.version for e in await store.read_stream(task_id)]
    done, refused = await store.execute_batch({task_id: lambda t: list(RUN(t))})
    assert not done and isinstance(refused[task_id], NotFound)
    assert [e.version for e in await store.read_stream(task_id)] == versions


async def test_tasks_by_ids_reads_only_what_this_store_did_not_write_at_that_version(
    store: EventStore, database_url: str
) -> None:
    ids = await new_tasks(store, 3)
    done, _ = await store.execute_batch({i: place() for i in ids})
    (moved,) = await started_elsewhere(database_url, ids[2])
    with psycopg.connect(database_url) as conn:  # seen only by a read of the document
        conn.execute(
            "UPDATE tasks SET doc = jsonb_set(doc, '{spec,name}', '\"changed\"')"
            " WHERE id = ANY(%s)",
            (ids[:2],),
        )
    got = await store.tasks_by_ids([*ids, "task-missing"])
    assert got == {ids[0]: done[ids[0]], ids[1]: done[ids[1]], ids[2]: moved}
    fresh = EventStore(store.pool)  # nothing kept: every document is read
    assert {t.spec.name for t in (await fresh.tasks_by_ids(ids[:2])).values()} == {"changed"}


async def test_pending_documents_are_not_kept(store: EventStore) -> None:
    """The placer hands the pending tasks it read over itself; kept, they would only push out
    the placed ones the agents' reports come for."""
    ids = await new_tasks(store, 2)
    why = partial(decide_pending_reason, code=ReasonCode.POOL_CAPACITY, reason="full")
    await store.execute_batch({ids[0]: lambda t: list(why(t))})
    assert store.written.known(ids) == {}
    done, _ = await store.execute_batch({i: place() for i in ids})
    assert store.written.known(ids) == done


async def test_a_batch_is_one_statement_that_keeps_order_documents_and_metadata(
    store: EventStore,
) -> None:
    """The events of a write and the projection rows go in as one JSON parameter each
    (records.py): positions follow the write's order, the stored rows equal what the batch
    returned, and metadata past orjson's 64-bit integers survive."""
    spec = TaskSpec(name="naïve — ✓", image="busybox", labels={"k": "v ✓"})
    tasks = await store.create_tasks([(T, spec, None, None)] * 40, metadata={"n": 2**70})
    ids = [t.id for t in tasks]
    async with store.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT stream_id, metadata FROM events WHERE stream_id = ANY(%s) ORDER BY position",
            (ids,),
        )
        rows = await cur.fetchall()
    assert [r[0] for r in rows] == ids  # insert order is the order of the batch
    assert all(r[1] == {"n": 2**70} for r in rows)
    for t in tasks:
        stored = await store.get_task(t.id)
        assert stored == t
        assert (stored.spec.name, stored.spec.labels) == ("naïve — ✓", {"k": "v ✓"})
    # One id twice in one upsert: written once, as its last item has it.
    first = tasks[0]
    later = first.model_copy(update={"version": first.version + 1})
    async with store.pool.connection() as conn:
        await projections.upsert(conn, TASKS, [first, later])
    assert (await store.get_task(first.id)).version == first.version + 1
    # The positions a write returns are those the rows got, each for its own event.
    appended = await store.append_stream(
        "system-x",
        [TenantUpdated(tenant_id="acme", gpu_quota=q) for q in (1, 2, 3)],
        metadata={"why": "test"},
    )
    in_store = await store.read_stream("system-x")
    assert [(e.position, e.version, e.payload) for e in appended] == [
        (e.position, e.version, e.payload) for e in in_store
    ]
    assert [e.payload["gpu_quota"] for e in in_store] == [1, 2, 3]


async def test_a_create_whose_stream_exists_is_a_conflict_that_writes_nothing(
    store: EventStore,
) -> None:
    """A create is one statement (the events' insert a CTE of the projection's upsert): when
    the task's stream is taken, neither the event nor the row is written, so the existing
    task's row is not overwritten by the refused one."""
    (first,) = await store.create_tasks([(T, TaskSpec(name="first", image="busybox"), None, None)])
    again = (T, TaskSpec(name="second", image="busybox"), None, None, first.id)
    with pytest.raises(Conflict):
        await store.create_tasks([again])
    assert (await store.get_task(first.id)).spec.name == "first"
    assert len(await store.read_stream(first.id)) == 1
    (later,) = await store.create_tasks([(T, TaskSpec(name="later", image="busybox"), None, None)])
    assert (await store.get_task(later.id)).version == 1  # the connection is usable after it
