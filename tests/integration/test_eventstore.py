"""Event store contract tests against a real PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import partial

import psycopg
import pytest

from libs import auth
from libs.domain.errors import Code, Conflict, DomainError, NotFound
from libs.domain.reasons import ReasonCode
from libs.domain.task.decide import decide_config_update, decide_transition
from libs.domain.task.model import TaskSpec, TenantId
from libs.domain.task.states import Actor, TaskStatus
from libs.store import tasks as task_rows
from libs.store.eventstore import EventStore, Guard, GuardFailed
from libs.store.migrations import MIGRATIONS, migrate
from libs.store.replay import rebuild
from libs.store.types import TaskQuery

pytestmark = pytest.mark.integration

S = TaskStatus
T = TenantId("acme")


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[EventStore]:
    st = await EventStore.open(database_url, max_size=25)
    await auth.create_tenant(st, "acme", "Acme")
    yield st
    await st.close()


def spec(**kw: object) -> TaskSpec:
    return TaskSpec.model_validate({"name": "t", "image": "busybox"} | kw)


async def walk(store: EventStore, task_id: str, *path: TaskStatus) -> None:
    for to in path:
        await store.execute(
            task_id,
            partial(
                decide_transition, to=to, actor=Actor.SCHEDULER, reason_code=ReasonCode.REPORTED
            ),
        )


def test_migrations_are_idempotent(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        first = migrate(conn)
        second = migrate(conn)
    assert first == [v for v, _ in MIGRATIONS]
    assert second == []


async def test_events_table_is_append_only(store: EventStore, database_url: str) -> None:
    await store.create_task(T, spec())
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            await conn.execute("UPDATE events SET type = 'x'")
        await conn.rollback()
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            await conn.execute("DELETE FROM events")


async def test_create_appends_one_event_and_projects(store: EventStore) -> None:
    task = await store.create_task(T, spec(name="train"))
    assert task.status is S.PENDING and task.version == 1
    events = await store.read_stream(task.id)
    assert [e.type for e in events] == ["task_created"]
    got = await store.get_task(task.id, tenant_id="acme")
    assert got == task


async def test_a_guarded_create_writes_only_while_its_guard_holds(
    store: EventStore, database_url: str
) -> None:
    def counts() -> tuple[int, int]:
        with psycopg.connect(database_url) as conn:
            row = conn.execute(
                "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM tasks)"
            ).fetchone()
            assert row is not None
            return int(row[0]), int(row[1])

    before = counts()
    with pytest.raises(GuardFailed):
        await store.create_task(T, spec(), guard=Guard("%s = 2", (1,)))
    assert counts() == before  # nothing of the create was written
    task = await store.create_task(T, spec(name="kept"), guard=Guard("%s = 1", (1,)))
    assert await store.get_task(task.id) == task
    assert counts() == (before[0] + 1, before[1] + 1)


async def test_other_tenant_sees_not_found(store: EventStore) -> None:
    task = await store.create_task(T, spec())
    with pytest.raises(NotFound):
        await store.get_task(task.id, tenant_id="other")


async def test_cas_miss_changes_nothing(store: EventStore) -> None:
    task = await store.create_task(T, spec())
    with pytest.raises(Conflict):
        await store.execute(
            task.id,
            lambda t: decide_transition(
                t,
                S.SCHEDULED,
                actor=Actor.SCHEDULER,
                reason_code=ReasonCode.REPORTED,
                expected_status=S.RUNNING,
            ),
        )
    assert len(await store.read_stream(task.id)) == 1
    assert (await store.get_task(task.id)).status is S.PENDING


async def test_illegal_transition_refused(store: EventStore) -> None:
    task = await store.create_task(T, spec())
    with pytest.raises(DomainError) as err:
        await store.execute(
            task.id,
            lambda t: decide_transition(
                t, S.COMPLETED, actor=Actor.OPERATOR, reason_code=ReasonCode.REPORTED
            ),
        )
    assert err.value.code == Code.ILLEGAL_TRANSITION
    assert len(await store.read_stream(task.id)) == 1


async def test_twenty_concurrent_terminal_reports_one_wins(store: EventStore) -> None:
    task = await store.create_task(T, spec())
    await walk(store, task.id, S.SCHEDULED, S.STARTING, S.RUNNING)

    async def report(i: int) -> str:
        try:
            await store.execute(
                task.id,
                lambda t: decide_transition(
                    t,
                    S.COMPLETED,
                    actor=Actor.AGENT,
                    reason_code=ReasonCode.REPORTED,
                    expected_status=S.RUNNING,
                    report=True,
                    exit_code=0,
                    result=f"r{i}",
                ),
            )
            return "ok"
        except Conflict:
            return "conflict"

    results = await asyncio.gather(*(report(i) for i in range(20)))
    assert results.count("ok") == 1
    assert results.count("conflict") == 19
    events = await store.read_stream(task.id)
    assert [e.type for e in events].count("task_status_changed") == 4
    final = await store.get_task(task.id)
    assert final.status is S.COMPLETED and final.exit_code == 0 and final.finished_at


async def test_list_filters_sort_and_paginate(store: EventStore) -> None:
    for i in range(5):
        await store.create_task(
            T, spec(name=f"job-{i}", priority=i, labels={"team": "a" if i % 2 else "b"})
        )
    tasks, total = await task_rows.list_tasks(
        store, TaskQuery(tenant_id="acme", per_page=2, page=1, sort="priority", order="desc")
    )
    assert total == 5 and [t.spec.priority for t in tasks] == [4, 3]
    tasks, total = await task_rows.list_tasks(
        store, TaskQuery(tenant_id="acme", labels={"team": "a"})
    )
    assert total == 2
    tasks, total = await task_rows.list_tasks(store, TaskQuery(tenant_id="acme", name="JOB-3"))
    assert total == 1 and tasks[0].spec.name == "job-3"
    _, total = await task_rows.list_tasks(store, TaskQuery(tenant_id="other"))
    assert total == 0


async def test_replay_rebuilds_identical_projections(store: EventStore) -> None:
    _, _key = await auth.issue_api_key(store, "acme", "ci")
    await auth.issue_system_credential(store, "operator", "root")
    a = await store.create_task(T, spec(name="a"))
    b = await store.create_task(T, spec(name="b"))
    await walk(store, a.id, S.SCHEDULED, S.STARTING, S.RUNNING, S.COMPLETED)
    await store.execute(b.id, lambda t: decide_config_update(t, {"memory_mb": 4096}))
    report = await rebuild(store)
    assert report.events == 10  # tenant, key, credential, 2 creates, 4 moves, 1 update
    assert report.differences == {}
    assert (await store.get_task(b.id)).spec.memory_mb == 4096


async def test_replay_reports_a_tampered_projection(store: EventStore, database_url: str) -> None:
    task = await store.create_task(T, spec())
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        await conn.execute("UPDATE tasks SET status = 'running' WHERE id = %s", (task.id,))
        await conn.commit()
    report = await rebuild(store, dry_run=True)
    assert report.differences == {"tasks": [task.id]}
