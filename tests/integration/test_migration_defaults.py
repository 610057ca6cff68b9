"""Rows stored before a field existed agree with replay once migrations 13, 14 and 15 give
them the field's default: a task without `ports`, `variant`, `requeues` or `spec.variants`, a
node without `quarantined_gpus` or whose inventory has no `host_id`, `port_range`,
`isolation`, `userns_remap`, `cgroups` or `telemetry` (and events of the same age)."""

from __future__ import annotations

import pytest

from libs.domain.node.events import NodeRegistered
from libs.domain.node.model import NodeInventory
from libs.store.migrations import MIGRATIONS
from libs.store.projections import NODES
from libs.store.replay import rebuild

from .helpers import AGENT_NODE, Api

pytestmark = pytest.mark.integration

NEW_INVENTORY_KEYS = ("host_id", "port_range", "isolation", "userns_remap", "cgroups", "telemetry")


async def test_rows_without_the_new_fields_are_migrated_and_replay_agrees(api: Api) -> None:
    inv = NodeInventory(memory_mb=8192, cpu_cores=4, address="10.1.2.3")
    reg = NodeRegistered(node_id=AGENT_NODE, inventory=inv)
    await api.store.execute_aggregate(NODES, AGENT_NODE, lambda _n: [reg])
    r = await api.client.post(
        "/api/v1/tasks", json={"name": "old", "image": "busybox:latest"}, headers=api.tenant
    )
    assert r.status_code == 201, r.text
    await api.place(r.json()["id"], AGENT_NODE)
    drop = "ARRAY[" + ", ".join(f"'{k}'" for k in NEW_INVENTORY_KEYS) + "]::text[]"
    async with api.store.pool.connection() as conn:
        # As the code before these fields wrote them, past the append-only trigger.
        await conn.execute("ALTER TABLE events DISABLE TRIGGER events_no_update")
        await conn.execute(
            "UPDATE events SET payload = jsonb_set(payload, '{inventory}',"
            f" (payload->'inventory') - {drop}) WHERE type = 'node_registered'"
        )
        await conn.execute("UPDATE events SET payload = payload - 'ports'")
        await conn.execute("ALTER TABLE events ENABLE TRIGGER events_no_update")
        await conn.execute(
            "UPDATE tasks SET doc = (doc - 'ports' - 'variant' - 'requeues') #- '{spec,variants}'"
        )
        await conn.execute("UPDATE nodes SET doc = doc - 'quarantined_gpus'")
        await conn.execute(
            f"UPDATE nodes SET doc = jsonb_set(doc, '{{inventory}}', (doc->'inventory') - {drop})"
        )
    assert (await rebuild(api.store, dry_run=True)).differences != {}  # the old shape
    async with api.store.pool.connection() as conn:
        await conn.execute(dict(MIGRATIONS)[13])
        await conn.execute(dict(MIGRATIONS)[14])
        await conn.execute(dict(MIGRATIONS)[15])
        cur = await conn.execute("SELECT doc->'inventory'->>'address' FROM nodes")
        row = await cur.fetchone()
        assert row is not None and row[0] == "10.1.2.3"  # what was there is kept
    assert (await rebuild(api.store, dry_run=True)).differences == {}
