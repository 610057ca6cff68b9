"""Agent keys in the API: bound to one node, good for reports on that node's tasks only."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from libs import auth
from libs.domain.errors import Code, DomainError
from libs.store.replay import rebuild

from .helpers import Api

pytestmark = pytest.mark.integration

BASE = {"name": "t", "image": "busybox:latest"}


async def _task(api: Api, node_id: str | None = None) -> str:
    r = await api.client.post("/api/v1/tasks", json=BASE, headers=api.tenant)
    assert r.status_code == 201, r.text
    tid = str(r.json()["id"])
    if node_id:
        await api.place(tid, node_id)
    return tid


async def _status(api: Api, tid: str) -> str:
    r = await api.client.get(f"/api/v1/tasks/{tid}", headers=api.tenant)
    return str(r.json()["status"])


async def test_an_agent_key_cannot_read_stop_delete_or_create(api: Api) -> None:
    tid = await _task(api, "n1")  # even a task of its own node
    calls = [
        ("GET", "/api/v1/tasks", None),
        ("GET", f"/api/v1/tasks/{tid}", None),
        ("GET", f"/api/v1/tasks/{tid}/events", None),
        ("GET", "/api/v1/tasks/stats", None),
        ("POST", f"/api/v1/tasks/{tid}/stop", None),
        ("DELETE", f"/api/v1/tasks/{tid}", None),
        ("POST", "/api/v1/tasks", BASE),
        ("GET", "/api/v1/nodes", None),
        ("POST", "/api/v1/nodes/n9/credentials", None),
        ("GET", "/api/v1/tenants", None),
    ]
    for method, path, body in calls:
        r = await api.client.request(method, path, json=body, headers=api.agent)
        assert r.status_code == 403, (method, path, r.text)
        assert r.json()["code"] == 40301
    assert await _status(api, tid) == "scheduled"


async def test_an_agent_reports_only_on_its_own_nodes_tasks(api: Api) -> None:
    mine, other, unplaced = await _task(api, "n1"), await _task(api, "n2"), await _task(api)
    before = len(await api.store.read_stream(other))
    for tid in (other, unplaced):
        r = await api.client.put(
            f"/api/v1/tasks/{tid}",
            json={"status": "completed", "exit_code": 0, "result": "forged"},
            headers=api.agent,
        )
        assert r.status_code == 403 and r.json()["code"] == 40301, r.text
        assert r.json()["fields"] == ["node_id"]
    assert len(await api.store.read_stream(other)) == before
    assert await _status(api, other) == "scheduled"
    # Nor may it claim another node's name in its own report.
    r = await api.client.put(
        f"/api/v1/tasks/{mine}", json={"status": "running", "node_id": "n2"}, headers=api.agent
    )
    assert r.status_code == 403 and r.json()["fields"] == ["node_id"]
    r = await api.client.put(f"/api/v1/tasks/{mine}", json={"status": "running"}, headers=api.agent)
    assert r.status_code == 200 and r.json()["status"] == "running", r.text


async def test_registering_a_node_again_revokes_its_old_key(api: Api) -> None:
    tid = await _task(api, "n7")
    first = await api.client.post("/api/v1/nodes/n7/credentials", headers=api.operator)
    assert first.status_code == 201, first.text
    assert first.json()["nats_user"] == "agent-n7"
    old = {"Authorization": f"Bearer {first.json()['agent_token']}"}
    second = await api.client.post("/api/v1/nodes/n7/credentials", headers=api.operator)
    new = {"Authorization": f"Bearer {second.json()['agent_token']}"}
    body = {"status": "starting", "expected_status": "scheduled"}
    r = await api.client.put(f"/api/v1/tasks/{tid}", json=body, headers=old)
    assert r.status_code == 401 and r.json()["code"] == 40101
    r = await api.client.put(f"/api/v1/tasks/{tid}", json=body, headers=new)
    assert r.status_code == 200, r.text


async def test_only_operators_register_nodes_and_ids_are_checked(api: Api) -> None:
    r = await api.client.post("/api/v1/nodes/n8/credentials", headers=api.tenant)
    assert r.status_code == 403 and r.json()["code"] == 40301
    r = await api.client.post("/api/v1/nodes/bad.node/credentials", headers=api.operator)
    assert r.status_code == 400 and r.json()["fields"] == ["node_id"]


async def test_a_join_token_registers_one_node_once(api: Api) -> None:
    r = await api.client.post("/api/v1/nodes/join-tokens?ttl_s=600", headers=api.operator)
    assert r.status_code == 201, r.text
    join = {"Authorization": f"Bearer {r.json()['join_token']}"}
    r = await api.client.post("/api/v1/nodes/j1/join", headers=join)
    assert r.status_code == 201 and r.json()["nats_user"] == "agent-j1", r.text
    key = {"Authorization": f"Bearer {r.json()['agent_token']}"}
    # Spent: neither the same node nor another may use it again.
    for node in ("j1", "j2"):
        again = await api.client.post(f"/api/v1/nodes/{node}/join", headers=join)
        assert again.status_code == 401 and again.json()["code"] == 40101
    tid = await _task(api, "j1")
    r = await api.client.put(f"/api/v1/tasks/{tid}", json={"status": "starting"}, headers=key)
    assert r.status_code == 200, r.text
    # Keys, revocations and join tokens are projections like any other: replay agrees.
    await api.client.post("/api/v1/nodes/j1/credentials", headers=api.operator)
    assert (await rebuild(api.store, dry_run=True)).differences == {}


async def test_join_tokens_are_refused_when_expired_or_for_a_registered_node(api: Api) -> None:
    now = datetime.now(UTC)
    old, _ = await auth.issue_join_token(api.store, timedelta(seconds=60), now - timedelta(hours=1))
    with pytest.raises(DomainError) as err:
        await auth.join_node(api.store, old, "j3", now)
    assert err.value.code is Code.UNAUTHENTICATED
    fresh, _ = await auth.issue_join_token(api.store, timedelta(seconds=60), now)
    r = await api.client.post(
        "/api/v1/nodes/n1/join", headers={"Authorization": f"Bearer {fresh}"}
    )  # n1 has a key: a join token does not take a node over
    assert r.status_code == 409 and r.json()["fields"] == ["node_id"]
    for bad in ("", "Bearer hf_tk_not-a-join-token"):
        r = await api.client.post("/api/v1/nodes/j4/join", headers={"Authorization": bad})
        assert r.status_code == 401
    r = await api.client.post("/api/v1/nodes/join-tokens", headers=api.tenant)
    assert r.status_code == 403
    r = await api.client.post("/api/v1/nodes/join-tokens?ttl_s=0", headers=api.operator)
    assert r.status_code == 400 and r.json()["fields"] == ["ttl_s"]
