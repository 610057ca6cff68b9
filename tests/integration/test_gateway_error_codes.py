"""SPEC §2 codes where seed 002 and the table meet, through the real gateway over real
PostgreSQL and NATS: node unreachable is HTTP 500 / 50002; an unknown field is 40001 at
any depth; work that cannot be placed is accepted and waits (50001 is never answered)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pydantic import SecretStr

from libs.bus.nats import connect
from libs.config import GatewaySettings
from libs.store.eventstore import EventStore

from .helpers import Api, gateway_api

pytestmark = pytest.mark.integration

TASK = {"name": "t", "image": "busybox:latest"}
VOLUME = {"host_path": "/data/models", "container_path": "/models"}


@pytest.fixture
async def gw(database_url: str, nats_url: str) -> AsyncIterator[Api]:
    """The gateway with a real bus connection: no agent listens on it."""
    store = await EventStore.open(database_url, max_size=10)
    nc = await connect(nats_url, "test-error-codes")
    settings = GatewaySettings(jwt_secret=SecretStr("e" * 32), volume_allow_list=["/data"])
    try:
        async with gateway_api(store, settings, nc) as api:
            yield api
    finally:
        await nc.close()
        await store.close()


async def test_logs_from_a_node_that_does_not_answer_are_500_50002(gw: Api) -> None:
    r = await gw.client.post("/api/v1/tasks", json=TASK, headers=gw.tenant)
    task_id = r.json()["id"]
    await gw.place(task_id, "gone-node")  # placed on a node no agent serves
    r = await gw.client.get(f"/api/v1/tasks/{task_id}/logs", headers=gw.tenant)
    assert r.status_code == 500, r.text  # seed 002: 500 / 50002 节点不可达
    body = r.json()
    assert body["code"] == 50002 and "gone-node" in body["error"] and task_id in body["error"]


async def test_an_unknown_field_is_40001_at_any_depth(gw: Api) -> None:
    top = await gw.client.post("/api/v1/tasks", json=TASK | {"mode": "rw"}, headers=gw.tenant)
    assert top.status_code == 400 and top.json()["code"] == 40001, top.text
    assert top.json()["fields"] == ["mode"]
    nested = TASK | {"volumes": [VOLUME | {"mode": "rw"}]}
    r = await gw.client.post("/api/v1/tasks", json=nested, headers=gw.tenant)
    assert r.status_code == 400, r.text
    assert (r.json()["code"], r.json()["fields"]) == (40001, ["volumes.0.mode"]), r.text
    assert "volumes.0.mode" in r.json()["error"]
    # Unknown names come first, as at the top level: a bad value beside one is not the answer.
    both = TASK | {"memory_mb": 0, "volumes": [VOLUME | {"mode": "rw"}]}
    r = await gw.client.post("/api/v1/tasks", json=both, headers=gw.tenant)
    assert (r.json()["code"], r.json()["fields"]) == (40001, ["volumes.0.mode"]), r.text
    # A bad nested value stays 40003.
    bad = TASK | {"volumes": [VOLUME | {"container_path": "relative"}]}
    r = await gw.client.post("/api/v1/tasks", json=bad, headers=gw.tenant)
    assert (r.json()["code"], r.json()["fields"]) == (40003, ["volumes.0.container_path"])
    # The same in a group's template and in a rollout's volumes.
    group = TASK | {"name": "web", "task_count": 2, "volumes": [VOLUME | {"mode": "rw"}]}
    r = await gw.client.post("/api/v1/task-groups", json=group, headers=gw.tenant)
    assert (r.json()["code"], r.json()["fields"]) == (40001, ["volumes.0.mode"]), r.text
    r = await gw.client.post("/api/v1/task-groups", json=group | {"volumes": []}, headers=gw.tenant)
    assert r.status_code == 201, r.text
    url = f"/api/v1/task-groups/{r.json()['id']}/rollout"
    r = await gw.client.post(url, json={"volumes": [VOLUME | {"mode": "rw"}]}, headers=gw.tenant)
    assert (r.json()["code"], r.json()["fields"]) == (40001, ["volumes.0.mode"]), r.text
    listed = (await gw.client.get("/api/v1/tasks", headers=gw.tenant)).json()
    assert listed["total"] == 2, "only the group's two members: every refusal wrote nothing"


async def test_work_that_cannot_be_placed_is_accepted_and_waits_never_50001(gw: Api) -> None:
    """Placement is asynchronous (SPEC §3): no node has 64 cards, and the pinned node does
    not exist, yet the task is accepted `pending`, as the scheduler would leave it."""
    body = TASK | {"gpu_required": 64, "requested_node_id": "no-such-node"}
    r = await gw.client.post("/api/v1/tasks", json=body, headers=gw.tenant)
    assert r.status_code == 201, r.text
    got = await gw.client.get(f"/api/v1/tasks/{r.json()['id']}", headers=gw.tenant)
    assert got.json()["status"] == "pending"
