"""The task API over HTTP against a real PostgreSQL: every create rule, list, update, auth."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import pytest

from libs.domain.reasons import ReasonCode
from libs.domain.task.decide import decide_transition
from libs.domain.task.states import Actor, TaskStatus

from .helpers import Api, bearer

pytestmark = pytest.mark.integration

BASE = {"name": "train", "image": "busybox:latest"}


async def create(a: Api, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    return await a.client.post("/api/v1/tasks", json=body, headers=headers or a.tenant)


async def test_create_returns_pending_with_defaults(api: Api) -> None:
    r = await create(api, BASE | {"command": "echo hi"})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["status"] == "pending"
    assert body["memory_mb"] == 2048 and body["cpu_cores"] == 1 and body["priority"] == 0
    assert body["max_retries"] == 3 and body["retry_strategy"] == "retry_new_node"
    assert body["tenant_id"] == "acme"
    listed = (await api.client.get("/api/v1/tasks", headers=api.tenant)).json()
    assert [t["id"] for t in listed["tasks"]] == [body["id"]]
    assert listed["total"] == 1 and listed["page"] == 1 and listed["per_page"] == 20


ACCEPTED = [
    ("gpu_count alias", {"gpu_count": 2}, {"gpu_required": 2}),
    ("env as list", {"env": ["A=1", "B=x=y"]}, {"env": {"A": "1", "B": "x=y"}}),
    ("env as map", {"env": {"A": "1"}}, {"env": {"A": "1"}}),
    ("fraction by vram", {"gpu_memory_mb": 4096}, {"gpu_memory_mb": 4096}),
    ("fraction by ratio", {"gpu_compute_ratio": 0.5}, {"gpu_compute_ratio": 0.5}),
    ("tenant priority 70", {"priority": 70}, {"priority": 70}),
    (
        "volume under allow-list",
        {
            "volumes": [
                {"host_path": "/data/models", "container_path": "/models", "read_only": True}
            ]
        },
        {
            "volumes": [
                {"host_path": "/data/models", "container_path": "/models", "read_only": True}
            ]
        },
    ),
    ("labels", {"labels": {"team": "ml"}}, {"labels": {"team": "ml"}}),
    ("task type", {"task_type": "inference"}, {"task_type": "inference"}),
    ("strategy", {"retry_strategy": "no_retry"}, {"retry_strategy": "no_retry"}),
    ("zero server-owned", {"retry_count": 0, "node_id": None, "rank": 0}, {"retry_count": 0}),
    ("pin", {"requested_node_id": "node-a"}, {"requested_node_id": "node-a"}),
    ("anti-affinity", {"anti_affinity": "web"}, {"anti_affinity": ["web"]}),
    ("idle timeout", {"idle_timeout_minutes": 15}, {"idle_timeout_minutes": 15}),
    ("timeout", {"timeout": 7200}, {"timeout": 7200}),
    ("name of 100", {"name": "n" * 100}, {"name": "n" * 100}),
]


@pytest.mark.parametrize(
    ("extra", "expect"), [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED]
)
async def test_create_accepts(api: Api, extra: dict[str, Any], expect: dict[str, Any]) -> None:
    r = await create(api, BASE | extra)
    assert r.status_code == 201, r.text
    body = r.json()
    for key, value in expect.items():
        assert body[key] == value


REFUSED = [
    ("unknown field", {"gpus": 1, "colour": "red"}, 40001, ["colour", "gpus"]),
    ("server-owned status", {"status": "running"}, 40002, ["status"]),
    ("server-owned group", {"group_id": "g1", "rank": 1}, 40002, ["group_id", "rank"]),
    ("server-owned retry_count", {"retry_count": 2}, 40002, ["retry_count"]),
    ("server-owned gpu_id", {"gpu_id": "GPU-1"}, 40002, ["gpu_id"]),
    ("reserved env key", {"env": ["HETEROFLOW_TOKEN=x"]}, 40003, ["env"]),
    ("reserved env key in map", {"env": {"heteroflow_x": "1"}}, 40003, ["env"]),
    ("malformed env", {"env": ["NOEQUALS"]}, 40003, ["env"]),
    (
        "volume outside allow-list",
        {"volumes": [{"host_path": "/etc", "container_path": "/x"}]},
        40003,
        ["volumes.0.host_path"],
    ),
    (
        "volume escaping with ..",
        {"volumes": [{"host_path": "/data/../etc", "container_path": "/x"}]},
        40003,
        ["volumes.0.host_path"],
    ),
    (
        "volume prefix trick",
        {"volumes": [{"host_path": "/database", "container_path": "/x"}]},
        40003,
        ["volumes.0.host_path"],
    ),
    (
        "volume unknown key",
        {"volumes": [{"host_path": "/data", "container_path": "/x", "mode": "rw"}]},
        40001,
        ["volumes.0.mode"],
    ),
    ("name over 100", {"name": "n" * 101}, 40003, ["name"]),
    ("name missing", {"name": None}, 40003, ["name"]),
    ("image blank", {"image": "  "}, 40003, ["image"]),
    ("tenant priority above 70", {"priority": 71}, 40003, ["priority"]),
    ("priority 100 reserved", {"priority": 100}, 40003, ["priority"]),
    ("priority negative", {"priority": -1}, 40003, ["priority"]),
    (
        "whole and fraction together",
        {"gpu_required": 1, "gpu_memory_mb": 4096},
        40003,
        ["gpu_required", "gpu_memory_mb"],
    ),
    ("alias disagrees", {"gpu_required": 1, "gpu_count": 2}, 40003, ["gpu_count", "gpu_required"]),
    ("ratio above 1", {"gpu_compute_ratio": 1.5}, 40003, ["gpu_compute_ratio"]),
    ("memory zero", {"memory_mb": 0}, 40003, ["memory_mb"]),
    ("memory as string", {"memory_mb": "4096"}, 40003, ["memory_mb"]),
    ("cpu negative", {"cpu_cores": -1}, 40003, ["cpu_cores"]),
    ("timeout negative", {"timeout": -5}, 40003, ["timeout"]),
    ("retries negative", {"max_retries": -1}, 40003, ["max_retries"]),
    ("bad strategy", {"retry_strategy": "sometimes"}, 40003, ["retry_strategy"]),
    ("bad task type", {"task_type": "web"}, 40003, ["task_type"]),
    ("preemptible not bool", {"preemptible": "yes"}, 40003, ["preemptible"]),
    ("labels not strings", {"labels": {"a": 1}}, 40003, ["labels.a"]),
    ("command not string", {"command": ["echo"]}, 40003, ["command"]),
]


@pytest.mark.parametrize(
    ("extra", "code", "fields"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
async def test_create_refuses(
    api: Api, extra: dict[str, Any], code: int, fields: list[str]
) -> None:
    r = await create(api, BASE | extra)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["code"] == code
    assert sorted(body["fields"]) == sorted(fields)
    for field in fields:
        assert field.split(".")[0] in body["error"]
    listed = (await api.client.get("/api/v1/tasks", headers=api.tenant)).json()
    assert listed["total"] == 0, "a refused request must write nothing"


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"[1,2]",
        b"null",
        b'{"name": "x", "image": ',
        "\udcff".encode(errors="surrogatepass"),
    ],
    ids=["empty", "garbage", "array", "null", "truncated", "bad utf8"],
)
async def test_malformed_bodies_are_400(api: Api, raw: bytes) -> None:
    r = await api.client.post(
        "/api/v1/tasks", content=raw, headers=api.tenant | {"content-type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["code"] == 40003


async def test_operator_priority_and_tenant_param(api: Api) -> None:
    r = await create(api, BASE | {"priority": 90}, api.operator)
    assert r.status_code == 400 and r.json()["fields"] == ["tenant_id"]
    r = await api.client.post(
        "/api/v1/tasks?tenant_id=acme", json=BASE | {"priority": 90}, headers=api.operator
    )
    assert r.status_code == 201 and r.json()["priority"] == 90


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({}, 401, 40101),
        ({"Authorization": "Bearer hf_tk_nope"}, 401, 40101),
        ({"Authorization": "Basic abc"}, 401, 40101),
        ({"Authorization": "Bearer a.b.c"}, 401, 40101),
    ],
    ids=["none", "unknown key", "wrong scheme", "garbage jwt"],
)
async def test_auth_required(api: Api, headers: dict[str, str], status: int, code: int) -> None:
    r = await api.client.get("/api/v1/tasks", headers=headers)
    assert r.status_code == status and r.json()["code"] == code


async def test_health_needs_no_auth(api: Api) -> None:
    assert (await api.client.get("/healthz")).json() == {"status": "ok"}
    assert (await api.client.get("/readyz")).status_code == 200


async def test_other_tenant_gets_404(api: Api) -> None:
    tid = (await create(api, BASE)).json()["id"]
    for method, path in [("GET", ""), ("PUT", ""), ("DELETE", ""), ("POST", "/stop")]:
        r = await api.client.request(
            method, f"/api/v1/tasks/{tid}{path}", headers=api.other_tenant, json={"memory_mb": 1}
        )
        assert r.status_code == 404 and r.json()["code"] == 40401, (method, path, r.text)
    assert (await api.client.get("/api/v1/tasks", headers=api.other_tenant)).json()["total"] == 0


async def test_jwt_user(api: Api) -> None:
    r = await api.client.post(
        "/api/v1/tenants/acme/tokens", json={"subject": "alice"}, headers=api.operator
    )
    assert r.status_code == 201, r.text
    user = bearer(r.json()["token"])
    assert (await create(api, BASE, user)).status_code == 201
    assert (await api.client.get("/api/v1/tasks", headers=user)).json()["total"] == 1


async def test_jwt_algorithm_pinned_and_exp_checked(api: Api) -> None:
    import jwt as pyjwt

    secret = api.settings.jwt_secret.get_secret_value()  # type: ignore[union-attr]
    claims = {"sub": "eve", "tenant_id": "acme", "iss": "heteroflow", "exp": 4102444800}
    none_alg = pyjwt.encode(claims, key="", algorithm="none")
    expired = pyjwt.encode(claims | {"exp": 1}, secret, algorithm="HS256")
    no_exp = pyjwt.encode({k: v for k, v in claims.items() if k != "exp"}, secret, "HS256")
    for token in (none_alg, expired, no_exp):
        r = await api.client.get("/api/v1/tasks", headers=bearer(token))
        assert r.status_code == 401 and r.json()["code"] == 40101


async def test_tenant_cannot_manage_tenants(api: Api) -> None:
    r = await api.client.post("/api/v1/tenants", json={"id": "x"}, headers=api.tenant)
    assert r.status_code == 403 and r.json()["code"] == 40301


async def test_operator_creates_tenant_and_key(api: Api) -> None:
    r = await api.client.post(
        "/api/v1/tenants", json={"id": "initech", "gpu_quota": 4}, headers=api.operator
    )
    assert r.status_code == 201 and r.json()["gpu_quota"] == 4
    again = await api.client.post("/api/v1/tenants", json={"id": "initech"}, headers=api.operator)
    assert again.status_code == 409
    r = await api.client.post(
        "/api/v1/tenants/initech/api-keys", json={"name": "ci"}, headers=api.operator
    )
    key = r.json()["key"]
    assert (await create(api, BASE, bearer(key))).status_code == 201
    keys = (await api.client.get("/api/v1/tenants/initech/api-keys", headers=api.operator)).json()
    assert key not in str(keys), "the key itself is never stored or shown again"


async def test_list_filters_and_validation(api: Api) -> None:
    for i in range(3):
        await create(api, BASE | {"name": f"job-{i}", "priority": i, "labels": {"k": str(i % 2)}})
    r = await api.client.get("/api/v1/tasks?sort=priority&order=asc&per_page=2", headers=api.tenant)
    body = r.json()
    assert [t["priority"] for t in body["tasks"]] == [0, 1] and body["total"] == 3
    r = await api.client.get("/api/v1/tasks?labels=k=1", headers=api.tenant)
    assert r.json()["total"] == 1
    r = await api.client.get("/api/v1/tasks?status=PENDING&name=job-2", headers=api.tenant)
    assert r.json()["total"] == 1
    # LIKE wildcards in the search are literal: "_" is not "any one character".
    r = await api.client.get("/api/v1/tasks?name=job_", headers=api.tenant)
    assert r.json()["total"] == 0
    # A page past the end is empty but still counts what matches.
    r = await api.client.get("/api/v1/tasks?page=9&per_page=2", headers=api.tenant)
    assert r.json()["tasks"] == [] and r.json()["total"] == 3
    for query, field in [
        ("sort=name", "sort"),
        ("status=zombie", "status"),
        ("per_page=0", "per_page"),
        ("page=x", "page"),
        ("colour=1", "colour"),
        ("labels=nokey", "labels"),
        ("order=up", "order"),
    ]:
        r = await api.client.get(f"/api/v1/tasks?{query}", headers=api.tenant)
        assert r.status_code == 400 and r.json()["fields"] == [field], query


async def test_update_pending_only_and_idle_timeout_any_time(api: Api) -> None:
    tid = (await create(api, BASE)).json()["id"]
    r = await api.client.put(f"/api/v1/tasks/{tid}", json={"memory_mb": 4096}, headers=api.tenant)
    assert r.status_code == 200 and r.json()["memory_mb"] == 4096
    for to in (TaskStatus.SCHEDULED, TaskStatus.STARTING, TaskStatus.RUNNING):
        await api.store.execute(
            tid,
            partial(
                decide_transition, to=to, actor=Actor.SCHEDULER, reason_code=ReasonCode.REPORTED
            ),
        )
    r = await api.client.put(f"/api/v1/tasks/{tid}", json={"memory_mb": 8192}, headers=api.tenant)
    assert r.status_code == 400 and r.json()["code"] == 40020 and "running" in r.json()["error"]
    r = await api.client.put(
        f"/api/v1/tasks/{tid}", json={"idle_timeout_minutes": 30}, headers=api.tenant
    )
    assert r.status_code == 200 and r.json()["idle_timeout_minutes"] == 30


@pytest.mark.parametrize("field", ["status", "result", "exit_code", "expected_status"])
async def test_tenant_report_fields_forbidden(api: Api, field: str) -> None:
    tid = (await create(api, BASE)).json()["id"]
    value: Any = 0 if field == "exit_code" else "completed"
    r = await api.client.put(f"/api/v1/tasks/{tid}", json={field: value}, headers=api.tenant)
    assert r.status_code == 403 and r.json()["code"] == 40301 and r.json()["fields"] == [field]
    assert (await api.client.get(f"/api/v1/tasks/{tid}", headers=api.tenant)).json()[
        "status"
    ] == "pending"


async def test_agent_reports_go_through_whitelist(api: Api) -> None:
    tid = (await create(api, BASE)).json()["id"]
    r = await api.client.put(
        f"/api/v1/tasks/{tid}", json={"status": "completed"}, headers=api.operator
    )
    assert r.status_code == 400 and r.json()["code"] == 40040
    await api.place(tid)
    for to in ("starting", "running", "stopping"):
        r = await api.client.put(f"/api/v1/tasks/{tid}", json={"status": to}, headers=api.agent)
        assert r.status_code == 200, r.text
    r = await api.client.put(
        f"/api/v1/tasks/{tid}",
        json={"status": "completed", "expected_status": "stopping"},
        headers=api.agent,
    )
    assert r.status_code == 400 and r.json()["code"] == 40040
    r = await api.client.put(
        f"/api/v1/tasks/{tid}",
        json={"status": "stopped", "expected_status": "running"},
        headers=api.agent,
    )
    assert r.status_code == 409 and r.json()["code"] == 40901
    r = await api.client.put(
        f"/api/v1/tasks/{tid}",
        json={"status": "stopped", "expected_status": "stopping", "exit_code": 137},
        headers=api.agent,
    )
    assert r.status_code == 200 and r.json()["status"] == "stopped"


async def test_twenty_concurrent_terminal_reports(api: Api) -> None:
    tid = (await create(api, BASE)).json()["id"]
    await api.place(tid)
    for to in ("starting", "running"):
        await api.client.put(f"/api/v1/tasks/{tid}", json={"status": to}, headers=api.agent)
    before = len(await api.store.read_stream(tid))
    body = {"status": "completed", "expected_status": "running", "exit_code": 0}
    results = await asyncio.gather(
        *(api.client.put(f"/api/v1/tasks/{tid}", json=body, headers=api.agent) for _ in range(20))
    )
    codes = sorted(r.status_code for r in results)
    assert codes.count(200) == 1 and codes.count(409) == 19, codes
    assert len(await api.store.read_stream(tid)) == before + 1


async def test_stop_pending_cancels_and_delete_hides(api: Api) -> None:
    tid = (await create(api, BASE)).json()["id"]
    r = await api.client.post(f"/api/v1/tasks/{tid}/stop", headers=api.tenant)
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    r = await api.client.post(f"/api/v1/tasks/{tid}/stop", headers=api.tenant)
    assert r.status_code == 400 and r.json()["code"] == 40030 and "cancelled" in r.json()["error"]
    r = await api.client.post(f"/api/v1/tasks/{tid}/sleep", headers=api.tenant)
    assert r.status_code == 400 and r.json()["code"] == 40030
    assert (await api.client.delete(f"/api/v1/tasks/{tid}", headers=api.tenant)).status_code == 200
    assert (await api.client.get(f"/api/v1/tasks/{tid}", headers=api.tenant)).status_code == 404
    assert (await api.client.get("/api/v1/tasks", headers=api.tenant)).json()["total"] == 0
    types = [e.type for e in await api.store.read_stream(tid)]
    assert types == ["task_created", "task_status_changed", "task_deleted"]


async def test_stats_scoped_to_tenant(api: Api) -> None:
    await create(api, BASE)
    await create(api, BASE, api.other_tenant)
    stats = (await api.client.get("/api/v1/tasks/stats", headers=api.tenant)).json()
    assert stats["total"] == 1 and stats["by_status"]["pending"] == 1
    assert set(stats["by_status"]) == {s.value for s in TaskStatus}


async def test_unknown_route_and_method(api: Api) -> None:
    r = await api.client.get("/api/v1/nope", headers=api.tenant)
    assert r.status_code == 404 and r.json()["code"] == 40401
    r = await api.client.patch("/api/v1/tasks", headers=api.tenant)
    assert r.status_code == 405 and "code" in r.json()


async def test_metrics_endpoint(api: Api) -> None:
    await create(api, BASE)
    r = await api.client.get("/metrics")
    assert r.status_code == 200
    assert 'heteroflow_events_appended_total{type="task_created"}' in r.text
    assert 'heteroflow_http_requests_total{method="POST",route="/api/v1/tasks",status="201"}' in (
        r.text
    )
