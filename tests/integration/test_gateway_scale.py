"""Manual group scale and tenant suspension over HTTP against a real PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from .helpers import Api

pytestmark = pytest.mark.integration

GROUP = {"name": "web", "image": "busybox:latest", "command": "httpd -f", "task_count": 2}


async def make_group(api: Api, **extra: Any) -> dict[str, Any]:
    r = await api.client.post("/api/v1/task-groups", json=GROUP | extra, headers=api.tenant)
    assert r.status_code == 201, r.text
    return dict(r.json())


async def scale(api: Api, gid: str, body: Any, headers: dict[str, str] | None = None) -> Any:
    return await api.client.post(
        f"/api/v1/task-groups/{gid}/scale", json=body, headers=headers or api.tenant
    )


async def test_scale_up_then_down(api: Api) -> None:
    group = await make_group(api)
    r = await scale(api, group["id"], {"replicas": 4})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["replicas"] == 4
    assert sorted(t["rank"] for t in body["tasks"]) == [0, 1, 2, 3]
    assert all(t["status"] == "pending" for t in body["tasks"])

    r = await scale(api, group["id"], {"replicas": 1})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["replicas"] == 1 and [t["rank"] for t in body["tasks"]] == [0]
    assert body["tasks"][0]["status"] == "pending"
    assert len(body["superseded_tasks"]) == 3  # ranks 1..3, cancelled while pending
    tasks = (await api.client.get("/api/v1/tasks?status=cancelled", headers=api.tenant)).json()
    assert tasks["total"] == 3
    assert {t["status_reason_code"] for t in tasks["tasks"]} == {"scaled_down"}

    # back up: rank 1 gets a fresh task, the cancelled one stays a remnant
    body = (await scale(api, group["id"], {"replicas": 2})).json()
    assert [(t["rank"], t["status"]) for t in body["tasks"]] == [(0, "pending"), (1, "pending")]
    again = (await api.client.get(f"/api/v1/task-groups/{group['id']}", headers=api.tenant)).json()
    assert again["replicas"] == 2


async def test_scale_to_same_size_writes_nothing(api: Api) -> None:
    group = await make_group(api)
    body = (await scale(api, group["id"], {"replicas": 2})).json()
    assert body["replicas"] == 2 and len(body["tasks"]) == 2


REFUSED = [
    ("training", {"task_type": "training"}, {"replicas": 3}, 400, 40003, "static-world"),
    (
        "tensor parallel",
        {"parallelism": "tensor_parallel", "tensor_parallel_size": 2},
        {"replicas": 3},
        400,
        40003,
        "parallelism=tensor_parallel",
    ),
    ("unknown field", {}, {"replicas": 3, "surge": 1}, 400, 40001, "surge"),
    ("missing replicas", {}, {}, 400, 40003, "replicas is required"),
    ("negative", {}, {"replicas": -1}, 400, 40003, "0..1024"),
    ("not a number", {}, {"replicas": "3"}, 400, 40003, "0..1024"),
    ("boolean", {}, {"replicas": True}, 400, 40003, "0..1024"),
]


@pytest.mark.parametrize(
    ("shape", "body", "status", "code", "text"),
    [c[1:] for c in REFUSED],
    ids=[c[0] for c in REFUSED],
)
async def test_scale_refused(
    api: Api, shape: dict[str, Any], body: Any, status: int, code: int, text: str
) -> None:
    group = await make_group(api, **shape)
    r = await scale(api, group["id"], body)
    assert r.status_code == status, r.text
    assert r.json()["code"] == code and text in r.json()["error"]
    after = (await api.client.get(f"/api/v1/task-groups/{group['id']}", headers=api.tenant)).json()
    assert after["replicas"] == group["replicas"] and len(after["tasks"]) == len(group["tasks"])


async def test_another_tenants_group_is_not_found(api: Api) -> None:
    group = await make_group(api)
    r = await scale(api, group["id"], {"replicas": 3}, api.other_tenant)
    assert r.status_code == 404 and r.json()["code"] == 40401


async def suspend(api: Api, tenant: str, value: bool) -> Any:
    return await api.client.put(
        f"/api/v1/tenants/{tenant}", json={"suspended": value}, headers=api.operator
    )


async def test_suspended_tenant_creates_nothing_and_only_scales_down(api: Api) -> None:
    group = await make_group(api, task_count=3)
    r = await suspend(api, "acme", True)
    assert r.status_code == 200 and r.json()["suspended"] is True, r.text

    task = {"name": "t", "image": "busybox:latest"}
    r = await api.client.post("/api/v1/tasks", json=task, headers=api.tenant)
    assert r.status_code == 403 and r.json()["code"] == 40301, r.text
    assert "suspended" in r.json()["error"]
    r = await api.client.post("/api/v1/task-groups", json=GROUP, headers=api.tenant)
    assert r.status_code == 403 and r.json()["code"] == 40301
    r = await scale(api, group["id"], {"replicas": 5})
    assert r.status_code == 403 and r.json()["code"] == 40301
    r = await scale(api, group["id"], {"replicas": 1})
    assert r.status_code == 200 and r.json()["replicas"] == 1, r.text
    # another tenant is untouched
    r = await api.client.post("/api/v1/tasks", json=task, headers=api.other_tenant)
    assert r.status_code == 201

    assert (await suspend(api, "acme", False)).json()["suspended"] is False
    r = await api.client.post("/api/v1/tasks", json=task, headers=api.tenant)
    assert r.status_code == 201, r.text


UPDATE_REFUSED = [
    ("unknown field", {"name": "x"}, 400, 40001),
    ("suspended not bool", {"suspended": "yes"}, 400, 40003),
    ("negative quota", {"gpu_quota": -1}, 400, 40003),
]


@pytest.mark.parametrize(
    ("body", "status", "code"), [c[1:] for c in UPDATE_REFUSED], ids=[c[0] for c in UPDATE_REFUSED]
)
async def test_tenant_update_refused(api: Api, body: Any, status: int, code: int) -> None:
    r = await api.client.put("/api/v1/tenants/acme", json=body, headers=api.operator)
    assert r.status_code == status and r.json()["code"] == code, r.text


async def test_tenant_update_is_for_operators(api: Api) -> None:
    r = await api.client.put("/api/v1/tenants/acme", json={"suspended": True}, headers=api.tenant)
    assert r.status_code == 403 and r.json()["code"] == 40301
    r = await api.client.put("/api/v1/tenants/nope", json={"gpu_quota": 2}, headers=api.operator)
    assert r.status_code == 404
    r = await api.client.put("/api/v1/tenants/acme", json={"gpu_quota": 4}, headers=api.operator)
    assert r.json()["gpu_quota"] == 4 and r.json()["suspended"] is False


async def test_schedule_window_at_creation(api: Api) -> None:
    window = {"start": "22:00", "end": "06:00", "timezone": "Europe/Paris", "action": "pause"}
    group = await make_group(api, schedule_window=window)
    assert group["schedule_window"]["days"] == ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
    assert group["schedule_window"]["timezone"] == "Europe/Paris"
    assert group["group_labels"] == {}
    assert "schedule_window" not in group["template"]


WINDOW_REFUSED = [
    (
        "static world scale above 0",
        {"task_type": "training"},
        {"action": "scale", "scale_to": 2},
        40003,
        "static-world",
    ),
    ("bad time", {}, {"action": "pause", "start": "25:00"}, 40003, "schedule_window.start"),
    ("unknown field", {}, {"action": "pause", "cron": "x"}, 40001, "schedule_window.cron"),
]


@pytest.mark.parametrize(
    ("shape", "window", "code", "text"),
    [c[1:] for c in WINDOW_REFUSED],
    ids=[c[0] for c in WINDOW_REFUSED],
)
async def test_schedule_window_refused(
    api: Api, shape: dict[str, Any], window: dict[str, Any], code: int, text: str
) -> None:
    body = GROUP | shape | {"schedule_window": {"start": "09:00", "end": "17:00"} | window}
    r = await api.client.post("/api/v1/task-groups", json=body, headers=api.tenant)
    assert r.status_code == 400 and r.json()["code"] == code, r.text
    assert text in r.json()["error"]
    listed = (await api.client.get("/api/v1/task-groups", headers=api.tenant)).json()
    assert listed["total"] == 0


async def test_group_list_pages_newest_first_within_the_tenant(api: Api) -> None:
    made = [(await make_group(api, name=f"g{i}"))["id"] for i in range(3)]
    await api.client.post("/api/v1/task-groups", json=GROUP, headers=api.other_tenant)
    first = (await api.client.get("/api/v1/task-groups?per_page=2", headers=api.tenant)).json()
    second = (
        await api.client.get("/api/v1/task-groups?per_page=2&page=2", headers=api.tenant)
    ).json()
    assert first["total"] == second["total"] == 3
    ids = [g["id"] for g in first["groups"] + second["groups"]]
    assert ids == made[::-1]
    stopped = await api.client.get("/api/v1/task-groups?status=stopped", headers=api.tenant)
    assert stopped.json()["total"] == 0 and stopped.json()["groups"] == []


@pytest.mark.parametrize("path", ["/api/v1/task-groups", "/api/v1/jobs"])
@pytest.mark.parametrize(
    ("query", "code", "field"),
    [("per_page=501", 40003, "per_page"), ("page=0", 40003, "page"), ("colour=x", 40001, "colour")],
)
async def test_group_and_job_lists_refuse_bad_pages_by_name(
    api: Api, path: str, query: str, code: int, field: str
) -> None:
    r = await api.client.get(f"{path}?{query}", headers=api.tenant)
    assert r.status_code == 400 and r.json()["code"] == code, r.text
    assert field in r.json()["fields"]
