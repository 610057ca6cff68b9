"""A client written against seed 002 (the V2 API) works: status names, `node_name`,
operation messages, and wake's only two 202 answers. Real PostgreSQL, no agent."""

from __future__ import annotations

from typing import Any

import pytest

from libs.domain.node.events import NodeRegistered
from libs.domain.node.model import NodeInventory
from libs.store.projections import NODES
from services.api_gateway import routes_ops

from .helpers import AGENT_NODE, Api

pytestmark = pytest.mark.integration

BASE = {"name": "v2", "image": "busybox:latest"}


async def online(api: Api) -> None:
    """AGENT_NODE registered and online (its agent is not running: nothing reports)."""
    inv = NodeInventory(memory_mb=8192, cpu_cores=4)
    reg = NodeRegistered(node_id=AGENT_NODE, inventory=inv)
    await api.store.execute_aggregate(NODES, AGENT_NODE, lambda _n: [reg])


async def create(api: Api) -> str:
    r = await api.client.post("/api/v1/tasks", json=BASE, headers=api.tenant)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def report(api: Api, task_id: str, status: str, **extra: Any) -> None:
    r = await api.client.put(
        f"/api/v1/tasks/{task_id}", json={"status": status, **extra}, headers=api.operator
    )
    assert r.status_code == 200, r.text


async def running(api: Api) -> str:
    task_id = await create(api)
    await api.place(task_id, AGENT_NODE)
    await report(api, task_id, "running")
    return task_id


async def post(api: Api, task_id: str, op: str) -> Any:
    return await api.client.post(f"/api/v1/tasks/{task_id}/{op}", headers=api.tenant)


async def listed(api: Api, status: str) -> tuple[int, Any]:
    r = await api.client.get("/api/v1/tasks", params={"status": status}, headers=api.tenant)
    return r.status_code, r.json()


async def test_list_takes_the_v2_status_names(api: Api) -> None:
    await online(api)
    done = await running(api)
    await report(api, done, "completed", exit_code=0)
    stopped = await running(api)
    assert (await post(api, stopped, "stop")).status_code == 200
    await report(api, stopped, "stopped")
    waiting = await create(api)
    for name, want in [
        ("SUCCESS", done),
        ("success", done),
        ("completed", done),
        ("STOPPED", stopped),
        ("PENDING", waiting),
    ]:
        code, body = await listed(api, name)
        assert code == 200, body
        assert [t["id"] for t in body["tasks"]] == [want], name
    code, body = await listed(api, "DONE")
    assert code == 400 and body["code"] == 40003 and body["fields"] == ["status"]
    assert "'done'" in body["error"].lower()  # the value named (as read: case-folded)


async def test_views_carry_node_name(api: Api) -> None:
    task_id = await create(api)
    r = await api.client.get(f"/api/v1/tasks/{task_id}", headers=api.tenant)
    assert "node_name" in r.json() and r.json()["node_name"] is None
    await api.place(task_id, AGENT_NODE)
    r = await api.client.get(f"/api/v1/tasks/{task_id}", headers=api.tenant)
    assert r.json()["node_name"] == AGENT_NODE
    r = await api.client.get("/api/v1/tasks", headers=api.tenant)
    assert r.json()["tasks"][0]["node_name"] == AGENT_NODE


async def test_stop_sleep_delete_answer_the_task_and_a_message(api: Api) -> None:
    await online(api)
    task_id = await running(api)
    r = await post(api, task_id, "sleep")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "sleeping" and body["message"] == "task put to sleep"
    assert body["id"] == task_id and body["name"] == "v2" and "node_name" in body
    r = await post(api, task_id, "stop")
    assert r.json()["status"] == "stopping" and r.json()["message"].startswith("stop requested")
    pending = await create(api)
    r = await post(api, pending, "stop")
    assert r.json()["status"] == "cancelled" and r.json()["message"] == "task cancelled"
    r = await api.client.delete(f"/api/v1/tasks/{pending}", headers=api.tenant)
    assert r.status_code == 200, r.text
    assert r.json()["message"] == "task deleted" and r.json()["id"] == pending
    assert r.json()["image"] == BASE["image"]


async def sleeping(api: Api) -> str:
    task_id = await running(api)
    assert (await post(api, task_id, "sleep")).status_code == 200
    return task_id


async def test_wake_with_the_host_offline_answers_202_rescheduling(api: Api) -> None:
    # No node row for AGENT_NODE: the host is unknown, as good as offline.
    task_id = await sleeping(api)
    r = await post(api, task_id, "wake")
    assert r.status_code == 202, r.text
    assert r.json()["status"] == "rescheduling" and r.json()["id"] == task_id
    assert r.json()["message"]
    r = await api.client.get(f"/api/v1/tasks/{task_id}", headers=api.tenant)
    assert r.json()["status"] == "pending" and r.json()["node_id"] is None


async def test_wake_the_agent_does_not_finish_answers_200_with_the_status(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    await online(api)
    monkeypatch.setattr(routes_ops, "WAKE_WAIT_S", 0.3)
    task_id = await sleeping(api)
    r = await post(api, task_id, "wake")  # online node, no agent to resume it
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "waking" and r.json()["id"] == task_id
    assert "waking" in r.json()["message"]
