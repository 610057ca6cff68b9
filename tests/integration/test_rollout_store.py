"""Generation and draining are durable: written as events, read back from PostgreSQL."""

from __future__ import annotations

import pytest

from libs import auth
from libs.domain.rollout.decide import decide_drain
from libs.domain.task.model import TaskSpec, TenantId
from libs.store import tasks as task_rows
from libs.store.eventstore import EventStore
from libs.store.replay import rebuild

pytestmark = pytest.mark.integration


async def test_generation_and_draining_survive_a_restart(database_url: str) -> None:
    store = await EventStore.open(database_url, max_size=4)
    await auth.create_tenant(store, "acme", "Acme")
    spec = TaskSpec(name="r", image="busybox")
    old = await store.create_task(TenantId("acme"), spec, group_id="g1", rank=0)
    (new,) = await store.create_tasks([(TenantId("acme"), spec, "g1", 0)], generation=2)
    await store.execute(old.id, decide_drain)
    await store.close()

    # A fresh process: nothing in memory, only what PostgreSQL holds.
    store = await EventStore.open(database_url, max_size=4)
    try:
        found = {t.id: t for t in await task_rows.of_group(store, "g1")}
        assert (found[old.id].generation, found[old.id].draining) == (0, True)
        assert (found[new.id].generation, found[new.id].draining) == (2, False)
        # The projection is exactly what the events fold to.
        report = await rebuild(store, dry_run=True)
        assert report.differences == {}
    finally:
        await store.close()
