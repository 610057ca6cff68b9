"""Stop and delete of a task whose node is offline end it at once (`stopped`): no agent is
there to report, and nothing else would (real PostgreSQL, no agent, no node monitor)."""

from __future__ import annotations

import pytest

from libs.domain.events import Payload
from libs.domain.node import NodeInventory, NodeOffline, NodeRegistered
from libs.domain.reasons import ReasonCode
from libs.store.projections import NODES

from .helpers import AGENT_NODE, Api

pytestmark = pytest.mark.integration


async def sleeping_task(api: Api) -> str:
    r = await api.client.post(
        "/api/v1/tasks", json={"name": "t", "image": "busybox"}, headers=api.tenant
    )
    task_id = str(r.json()["id"])
    await api.place(task_id, AGENT_NODE)
    r = await api.client.put(
        f"/api/v1/tasks/{task_id}", json={"status": "running"}, headers=api.operator
    )
    assert r.status_code == 200, r.text
    r = await api.client.post(f"/api/v1/tasks/{task_id}/sleep", headers=api.tenant)
    assert r.json()["status"] == "sleeping", r.text
    return task_id


async def node_goes(api: Api, *events: Payload) -> None:
    await api.store.execute_aggregate(NODES, AGENT_NODE, lambda _n: list(events))


async def test_stop_and_delete_on_an_offline_node_end_at_once(api: Api) -> None:
    inv = NodeInventory(memory_mb=8192, cpu_cores=4)
    await node_goes(api, NodeRegistered(node_id=AGENT_NODE, inventory=inv))
    online = await sleeping_task(api)
    r = await api.client.post(f"/api/v1/tasks/{online}/stop", headers=api.tenant)
    assert r.json()["status"] == "stopping", "an online node's agent reports the stop"

    await node_goes(
        api,
        NodeOffline(node_id=AGENT_NODE, silent_seconds=30, reason_code=ReasonCode.NODE_LOST),
    )
    stopped, deleted = await sleeping_task(api), await sleeping_task(api)
    r = await api.client.post(f"/api/v1/tasks/{stopped}/stop", headers=api.tenant)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "stopped" and body["status_reason_code"] == "node_lost"
    assert AGENT_NODE in body["error"]
    r = await api.client.delete(f"/api/v1/tasks/{deleted}", headers=api.tenant)
    assert r.status_code == 200 and r.json()["status"] == "stopped", r.text
    stats = (await api.client.get("/api/v1/tasks/stats", headers=api.tenant)).json()
    assert stats["by_status"]["stopping"] == 1 and stats["by_status"]["sleeping"] == 0
