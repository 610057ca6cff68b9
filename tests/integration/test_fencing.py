"""Fencing against a real NATS lease and a real PostgreSQL store: a leader that lost its
lease without noticing cannot commit once its successor has shown the store a newer token."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import psycopg
import pytest
from nats.aio.client import Client
from nats.js.kv import KeyValue

from libs import auth
from libs.bus.lease import Lease, open_lease_bucket
from libs.bus.nats import connect
from libs.domain.errors import Fenced
from libs.domain.task.model import Task, TaskSpec, TenantId
from libs.domain.task.states import TaskStatus
from libs.store import fencing
from libs.store.eventstore import EventStore
from libs.store.fenced import FencedWriter
from libs.store.fencing import Fence
from services.scheduler.controllers.placement import Placer
from services.scheduler.placement.model import Placement, Plan

pytestmark = pytest.mark.integration

TTL = 1.0


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    client = await connect(nats_url, "test-fencing")
    yield client
    await client.close()


@pytest.fixture
async def kv(nc: Client) -> AsyncIterator[KeyValue]:
    js = nc.jetstream()
    bucket = "hf_leases_" + uuid.uuid4().hex[:8]
    yield await open_lease_bucket(js, TTL, bucket=bucket)
    await js.delete_key_value(bucket)


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[EventStore]:
    st = await EventStore.open(database_url)
    await auth.create_tenant(st, "acme", "Acme")
    yield st
    await st.close()


def table_counts(database_url: str) -> dict[str, int]:
    with psycopg.connect(database_url) as conn:
        return {
            t: int(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0])  # type: ignore[index]
            for t in ("events", "tasks", "fences")
        }


async def take_over(kv: KeyValue, name: str, holder: str) -> Lease:
    """Contend until the lease is ours (the previous holder stopped renewing)."""
    lease = Lease(kv, name, holder, TTL)
    deadline = time.monotonic() + 10 * TTL
    while not await lease.acquire():
        assert time.monotonic() < deadline, "the lease never expired"
        await asyncio.sleep(0.05)
    return lease


async def test_a_deposed_leader_cannot_commit_a_placement(
    kv: KeyValue, store: EventStore, database_url: str
) -> None:
    spec = TaskSpec.model_validate({"name": "t", "image": "busybox"})
    first, second = await store.create_tasks([(TenantId("acme"), spec, None, None)] * 2)

    # A holds the lease and places the first task under its fence.
    a = Lease(kv, "scheduler", "a", TTL)
    assert await a.acquire() and a.fencing_token is not None
    placer_a = Placer(
        store,
        lambda: datetime.now(UTC),
        writer=FencedWriter(store, Fence("scheduler", a.fencing_token)),
    )
    placed = await placer_a.commit(Plan(placements=(Placement(first.id, "n1"),)), {})
    assert placed.placements == [first.id]

    # A stops renewing (paused, partitioned); its lease expires and B takes it over.
    b = await take_over(kv, "scheduler", "b")
    assert b.fencing_token is not None and b.fencing_token > a.fencing_token
    fence_b = Fence("scheduler", b.fencing_token)
    await store.claim_fence(fence_b)  # what the controller runtime does as a term begins

    # A, not knowing, commits a placement: refused, and nothing is written; both when it
    # holds the task's document (one statement, eventstore `_known_steps`) and when the
    # store reads the row under its lock.
    before = table_counts(database_url)
    holds: list[dict[str, Task]] = [{second.id: second}, {}]
    for held in holds:
        with pytest.raises(Fenced) as refused:
            await placer_a.commit(Plan(placements=(Placement(second.id, "n1"),)), held)
        assert (refused.value.token, refused.value.newest) == (a.fencing_token, b.fencing_token)
        assert table_counts(database_url) == before
    after = await store.get_task(second.id)
    assert (after.status, after.version, after.node_id) == (TaskStatus.PENDING, 1, None)

    # B's own placement of the same task goes through, carrying B's fence.
    placer_b = Placer(store, lambda: datetime.now(UTC), writer=FencedWriter(store, fence_b))
    placed = await placer_b.commit(
        Plan(placements=(Placement(second.id, "n2"),)), {second.id: second}
    )
    assert placed.placements == [second.id]
    (event,) = [e for e in await store.read_stream(second.id) if e.version == 2]
    assert event.metadata == {"lease": "scheduler", "fencing_token": b.fencing_token}
    assert not await a.renew()  # and A finds out it lost the lease
    await b.release()


async def test_the_store_keeps_the_greatest_token_per_lease(store: EventStore) -> None:
    await store.claim_fence(Fence("node-monitor", 10))
    await store.claim_fence(Fence("group-controller", 3))  # another lease: its own tokens
    with pytest.raises(Fenced):
        await store.claim_fence(Fence("node-monitor", 9))
    await store.claim_fence(Fence("node-monitor", 10))  # the same holder again: accepted
    await store.claim_fence(Fence("node-monitor", 12))
    with pytest.raises(Fenced):
        await store.claim_fence(Fence("node-monitor", 10))


async def test_a_lost_lease_bucket_goes_on_above_the_fences_and_the_old_leader_stays_refused(
    nc: Client, store: EventStore, database_url: str
) -> None:
    """The bucket (with its JetStream store) lost and declared again: its revisions start at
    1, while the store remembers the old leader's token. Declared with the store's newest
    fence as the floor (as `heteroflow up` declares it), the next leader's token is above
    it, its claim is accepted, and the old leader's writes are still refused."""
    js = nc.jetstream()
    bucket = "hf_leases_" + uuid.uuid4().hex[:8]
    spec = TaskSpec.model_validate({"name": "t", "image": "busybox"})
    (task,) = await store.create_tasks([(TenantId("acme"), spec, None, None)])

    # A long-running installation: the old leader won its term at a high revision (the
    # bucket raised to stand in for the terms and renewals before it).
    kv = await open_lease_bucket(js, TTL, bucket=bucket, floor=4999)
    old = Lease(kv, "scheduler", "old", TTL)
    assert await old.acquire() and old.fencing_token == 5000
    old_fence = Fence("scheduler", old.fencing_token)
    await store.claim_fence(old_fence)

    # The store is lost: made again without the floor, the bucket starts at 1 and a new
    # leader is refused (what the platform did before it declared the floor).
    await js.delete_key_value(bucket)
    kv = await open_lease_bucket(js, TTL, bucket=bucket)
    stale = Lease(kv, "scheduler", "new", TTL)
    assert await stale.acquire() and stale.fencing_token == 1
    with pytest.raises(Fenced):
        await store.claim_fence(Fence("scheduler", stale.fencing_token))

    # Declared again with the floor: the bucket moves past it, and its leases with it.
    async with store.pool.connection() as conn:
        floor = await fencing.newest_of_all(conn)
    assert floor == 5000
    kv = await open_lease_bucket(js, TTL, bucket=bucket, floor=floor)
    assert not await stale.renew(), "a lease of the bucket behind the floor is gone"
    new = Lease(kv, "scheduler", "new", TTL)
    assert await new.acquire() and new.fencing_token is not None
    assert new.fencing_token > old.fencing_token
    new_fence = Fence("scheduler", new.fencing_token)
    await store.claim_fence(new_fence)

    # The old leader, not knowing, writes: refused, nothing written.
    placer_old = Placer(store, lambda: datetime.now(UTC), writer=FencedWriter(store, old_fence))
    before = table_counts(database_url)
    with pytest.raises(Fenced) as refused:
        await placer_old.commit(Plan(placements=(Placement(task.id, "n1"),)), {})
    assert (refused.value.token, refused.value.newest) == (5000, new.fencing_token)
    assert table_counts(database_url) == before

    # The new leader's write goes through; the bucket is already above the floor, so
    # declaring it again (every start of `up`) leaves it and its leases alone.
    placer_new = Placer(store, lambda: datetime.now(UTC), writer=FencedWriter(store, new_fence))
    placed = await placer_new.commit(Plan(placements=(Placement(task.id, "n2"),)), {})
    assert placed.placements == [task.id]
    kv = await open_lease_bucket(js, TTL, bucket=bucket, floor=new.fencing_token)
    assert await new.renew()
    await new.release()
    await js.delete_key_value(bucket)
