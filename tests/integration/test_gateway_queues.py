"""`/pools` and `/queues` over a real store: operators manage them, tenants see their own
queues, every refusal names its field, submissions land in a queue, replay rebuilds them."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from libs.store import queues as queue_rows
from libs.store.replay import rebuild

from .helpers import Api

POOL = {"name": "a100", "node_selector": {"gpu_type": "A100"}}
QUEUE = {"name": "alg", "tenant": "acme", "pools": ["a100"], "quota": {"max_gpus": 4}}


async def post(api: Api, path: str, body: Any, who: dict[str, str] | None = None) -> httpx.Response:
    return await api.client.post(f"/api/v1/{path}", json=body, headers=who or api.operator)


async def test_pool_and_queue_lifecycle_and_replay(api: Api) -> None:
    assert (await post(api, "pools", POOL)).status_code == 201
    again = await post(api, "pools", POOL)
    assert again.status_code == 409 and again.json()["code"] == 40901
    r = await post(api, "queues", QUEUE)
    assert r.status_code == 201, r.text
    assert r.json()["policy"] == "priority" and r.json()["quota"]["max_gpus"] == 4

    r = await api.client.put(
        "/api/v1/queues/alg",
        json=QUEUE | {"quota": {"max_gpus": 8, "max_running_jobs": 2}, "policy": "fifo"},
        headers=api.operator,
    )
    assert r.status_code == 200, r.text
    assert r.json()["quota"] == {"max_gpus": 8, "max_running_jobs": 2, "max_running_tasks": 0}
    assert r.json()["usage"] == {"gpus": 0.0, "running_tasks": 0, "running_jobs": 0}

    busy = await api.client.delete("/api/v1/pools/a100", headers=api.operator)
    assert busy.status_code == 400 and "queue(s) alg" in busy.json()["error"]
    report = await rebuild(api.store, dry_run=True)
    assert report.differences == {}
    assert (await api.client.delete("/api/v1/queues/alg", headers=api.operator)).status_code == 200
    assert (await api.client.delete("/api/v1/pools/a100", headers=api.operator)).status_code == 200
    listed = await api.client.get("/api/v1/pools", headers=api.operator)
    assert listed.json() == {"pools": []}
    assert (await rebuild(api.store, dry_run=True)).differences == {}


async def test_refusals_name_the_field(api: Api) -> None:
    await post(api, "pools", POOL)
    cases = [
        ("pools", POOL | {"name": "p2", "size": 3}, 40001, ["size"]),
        ("pools", {"name": "p3", "node_selector": {"gpu": "x"}}, 40001, ["node_selector.gpu"]),
        ("queues", QUEUE | {"pools": ["nope"]}, 40003, ["pools"]),
        ("queues", QUEUE | {"tenant": "nobody"}, 40003, ["tenant"]),
        ("queues", QUEUE | {"pools": []}, 40003, ["pools"]),
        ("queues", QUEUE | {"quota": {"max_gpus": -1}}, 40003, ["quota.max_gpus"]),
        ("queues", QUEUE | {"policy": "lifo"}, 40003, ["policy"]),
    ]
    for path, body, code, fields in cases:
        r = await post(api, path, body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["code"] == code, (body, r.json())
        assert set(fields) <= set(r.json()["fields"]), (body, r.json())
    tenant_try = await post(api, "pools", POOL | {"name": "mine"}, api.tenant)
    assert tenant_try.status_code == 403


async def test_tasks_go_into_a_queue(api: Api) -> None:
    await post(api, "pools", POOL)
    await post(api, "queues", QUEUE | {"default": True})
    second = await post(api, "queues", QUEUE | {"name": "other", "default": True})
    assert second.status_code == 400 and second.json()["fields"] == ["default"]
    await post(api, "queues", {"name": "gx", "tenant": "globex", "pools": ["a100"]})

    task = {"name": "t", "image": "busybox:latest", "gpu_required": 2}
    r = await post(api, "tasks", task, api.tenant)
    assert r.status_code == 201 and r.json()["queue"] == "alg"  # the default queue
    r = await post(api, "tasks", task | {"gpu_required": 5}, api.tenant)
    assert r.status_code == 400 and "max_gpus 4" in r.json()["error"]
    r = await post(api, "tasks", task | {"queue": "gx"}, api.tenant)
    assert r.status_code == 400 and r.json()["fields"] == ["queue"]  # another tenant's

    mine = await api.client.get("/api/v1/queues", headers=api.tenant)
    assert [q["name"] for q in mine.json()["queues"]] == ["alg"]
    hidden = await api.client.get("/api/v1/queues/gx", headers=api.tenant)
    assert hidden.status_code == 404
    shown = await api.client.get("/api/v1/queues/alg", headers=api.tenant)
    assert shown.json()["pending"] == 1


async def test_a_create_sees_a_queue_changed_since_this_process_last_read_it(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A create reuses the queue this gateway process resolved the last one to, under a
    guard that it did not move; a queue made, changed or deleted since (through any worker:
    the queue routes leave the held queue alone, as another worker's would) is seen."""
    reads = {"n": 0}
    default_of = queue_rows.default_of

    async def counted(store: Any, tenant_id: str) -> Any:
        reads["n"] += 1
        return await default_of(store, tenant_id)

    monkeypatch.setattr(queue_rows, "default_of", counted)
    task = {"name": "t", "image": "busybox:latest", "gpu_required": 2}

    async def create(body: dict[str, Any] = task) -> httpx.Response:
        return await post(api, "tasks", body, api.tenant)

    assert (await create()).json()["queue"] == ""  # no queue yet: read
    before = reads["n"]
    assert (await create()).json()["queue"] == "" and reads["n"] == before  # held, not read
    await post(api, "pools", POOL)
    assert (await post(api, "queues", QUEUE | {"default": True})).status_code == 201
    assert (await create()).json()["queue"] == "alg"  # the guard saw the new default queue
    before = reads["n"]
    assert (await create()).json()["queue"] == "alg" and reads["n"] == before

    tighter = QUEUE | {"default": True, "quota": {"max_gpus": 1}}
    assert (
        await api.client.put("/api/v1/queues/alg", json=tighter, headers=api.operator)
    ).is_success
    refused = await create()  # the held queue allowed 4 cards: its new version allows 1
    assert refused.status_code == 400 and "max_gpus 1" in refused.json()["error"]
    wider = QUEUE | {"default": True, "quota": {"max_gpus": 8}}
    assert (await api.client.put("/api/v1/queues/alg", json=wider, headers=api.operator)).is_success
    five = await create(task | {"gpu_required": 5})  # the held version refuses: read again
    assert five.status_code == 201 and five.json()["queue"] == "alg", five.text

    assert (await api.client.delete("/api/v1/queues/alg", headers=api.operator)).is_success
    assert (await create()).json()["queue"] == ""  # the held queue is gone
    pending = await api.client.get("/api/v1/tasks", headers=api.tenant)
    assert len(pending.json()["tasks"]) == 6  # every create above but the refusal, once
