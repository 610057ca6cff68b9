"""The web console's pages over a real store, through the gateway app (no browser): sign-in,
the cookie's flags, CSRF, the security headers, the form's errors named by field, tenant
scope, operator-only pages. The browser tests are in test_console_browser.py."""

from __future__ import annotations

import re

from services.api_gateway.console.web import COOKIE, csrf_token

from .helpers import Api

FORM = {"content-type": "application/x-www-form-urlencoded"}


def key_of(headers: dict[str, str]) -> str:
    return headers["Authorization"].removeprefix("Bearer ")


async def signed_in(api: Api, headers: dict[str, str]) -> str:
    key = key_of(headers)
    r = await api.client.post("/ui/login", content=f"key={key}", headers=FORM)
    assert r.status_code == 303 and r.headers["location"] == "/ui/tasks", r.text
    cookie = r.headers["set-cookie"]
    assert f"{COOKIE}=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert "Path=/ui" in cookie
    return key


async def test_sign_in_refuses_a_bad_key_and_keeps_the_key_out_of_urls(api: Api) -> None:
    r = await api.client.post("/ui/login", content="key=nonsense", headers=FORM)
    assert r.status_code == 401 and COOKIE not in r.headers.get("set-cookie", "")
    key = await signed_in(api, api.tenant)
    r = await api.client.get("/ui/tasks")
    assert r.status_code == 200 and key not in r.text  # never echoed into the page
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert r.headers["x-content-type-options"] == "nosniff"


async def test_without_a_session_pages_lead_to_sign_in(api: Api) -> None:
    for path in ("/ui/", "/ui/tasks", "/ui/tasks/new", "/ui/nodes", "/ui/groups"):
        r = await api.client.get(path)
        assert r.status_code == 303 and r.headers["location"] == "/ui/login", path


async def test_the_form_names_the_wrong_field_and_creates_nothing(api: Api) -> None:
    key = await signed_in(api, api.tenant)
    csrf = csrf_token(key)
    body = f"csrf={csrf}&name=f&image=busybox%3Blatest&command=true&memory_mb=lots"
    r = await api.client.post("/ui/tasks/new", content=body, headers=FORM)
    assert r.status_code == 400
    assert re.search(r'id="e-(image|memory_mb)"', r.text), r.text
    listed = await api.client.get("/api/v1/tasks", headers=api.tenant)
    assert listed.json()["total"] == 0
    bad_env = f"csrf={csrf}&name=f&image=busybox&env=NOEQUALS"
    r = await api.client.post("/ui/tasks/new", content=bad_env, headers=FORM)
    assert r.status_code == 400 and 'id="e-env"' in r.text and "NAME=value" in r.text


async def test_a_created_task_is_shown_and_another_tenant_sees_not_found(api: Api) -> None:
    key = await signed_in(api, api.tenant)
    body = f"csrf={csrf_token(key)}&name=hello&image=busybox&command=echo+hi&memory_mb=256"
    r = await api.client.post("/ui/tasks/new", content=body, headers=FORM)
    assert r.status_code == 303, r.text
    task_id = r.headers["location"].rsplit("/", 1)[1]
    r = await api.client.get(f"/api/v1/tasks/{task_id}", headers=api.tenant)
    assert r.json()["memory_mb"] == 256 and r.json()["command"] == "echo hi"
    page = await api.client.get(f"/ui/tasks/{task_id}")
    assert page.status_code == 200 and "hello" in page.text and task_id in page.text
    listing = await api.client.get("/ui/tasks")
    assert f"/ui/tasks/{task_id}" in listing.text
    api.client.cookies.clear()
    await signed_in(api, api.other_tenant)
    r = await api.client.get(f"/ui/tasks/{task_id}")
    assert r.status_code == 404 and "not found" in r.text.lower()


async def test_changes_need_the_csrf_token_and_the_same_origin(api: Api) -> None:
    key = await signed_in(api, api.tenant)
    r = await api.client.post(
        "/api/v1/tasks", json={"name": "t", "image": "busybox"}, headers=api.tenant
    )
    task_id = r.json()["id"]
    r = await api.client.post(f"/ui/tasks/{task_id}/stop", content="csrf=wrong", headers=FORM)
    assert r.status_code == 403
    forged = FORM | {"origin": "http://evil.example"}
    r = await api.client.post(
        f"/ui/tasks/{task_id}/stop", content=f"csrf={csrf_token(key)}", headers=forged
    )
    assert r.status_code == 403
    r = await api.client.get(f"/api/v1/tasks/{task_id}", headers=api.tenant)
    assert r.json()["status"] == "pending"  # nothing changed
    r = await api.client.post(
        f"/ui/tasks/{task_id}/stop", content=f"csrf={csrf_token(key)}", headers=FORM
    )
    assert r.status_code == 303
    r = await api.client.get(f"/api/v1/tasks/{task_id}", headers=api.tenant)
    assert r.json()["status"] in ("stopped", "cancelled", "stopping")


async def test_nodes_are_for_operators(api: Api) -> None:
    await signed_in(api, api.tenant)
    r = await api.client.get("/ui/nodes")
    assert r.status_code == 403 and "operator" in r.text.lower()
    api.client.cookies.clear()
    await signed_in(api, api.operator)
    r = await api.client.get("/ui/nodes")
    assert r.status_code == 200 and "<table>" in r.text


async def test_the_other_sections_list(api: Api) -> None:
    await signed_in(api, api.tenant)
    for section in ("groups", "jobs", "queues", "pools"):
        r = await api.client.get(f"/ui/{section}")
        assert r.status_code == 200, (section, r.text[:300])
    assert (await api.client.get("/ui/nothing")).status_code == 404


async def test_static_assets_are_served(api: Api) -> None:
    r = await api.client.get("/ui/static/console.js")
    assert r.status_code == 200 and "EventSource" in r.text


async def test_a_group_shows_its_members_by_rank(api: Api) -> None:
    await signed_in(api, api.tenant)
    body = {"name": "web", "image": "busybox:latest", "command": "true", "task_count": 3}
    r = await api.client.post("/api/v1/task-groups", json=body, headers=api.tenant)
    assert r.status_code == 201, r.text
    group = r.json()
    page = await api.client.get(f"/ui/groups/{group['id']}")
    assert page.status_code == 200, page.text
    ids = [t["id"] for t in sorted(group["tasks"], key=lambda t: t["rank"])]
    positions = [page.text.index(f"/ui/tasks/{i}") for i in ids]
    assert positions == sorted(positions)  # rank order
    listing = await api.client.get("/ui/groups")
    assert f"/ui/groups/{group['id']}" in listing.text


async def test_a_job_is_drawn_by_depth(api: Api) -> None:
    await signed_in(api, api.tenant)
    body = {
        "name": "pipe",
        "tasks": [
            {"key": "evaluate", "name": "e", "image": "busybox:latest"},
            {"key": "prepare", "name": "p", "image": "busybox:latest"},
            {"key": "training", "name": "t", "image": "busybox:latest"},
        ],
        "dependencies": [
            {"task": "training", "on": "prepare"},
            {"task": "evaluate", "on": "training"},
        ],
    }
    r = await api.client.post("/api/v1/jobs", json=body, headers=api.tenant)
    assert r.status_code == 201, r.text
    page = await api.client.get(f"/ui/jobs/{r.json()['id']}")
    assert page.status_code == 200, page.text
    text = page.text
    # Declared evaluate-first, drawn by depth: prepare (0), training (1), evaluate (2).
    assert text.index(">prepare<") < text.index(">training<") < text.index(">evaluate<")
    assert "depth 2" in text and "after training" in text


async def test_queues_show_usage_against_quota(api: Api) -> None:
    pool = {"name": "all", "node_selector": {"gpu_type": "A100"}}
    r = await api.client.post("/api/v1/pools", json=pool, headers=api.operator)
    assert r.status_code == 201, r.text
    queue = {"name": "small", "tenant": "acme", "pools": ["all"], "quota": {"max_gpus": 4}}
    r = await api.client.post("/api/v1/queues", json=queue, headers=api.operator)
    assert r.status_code == 201, r.text
    await signed_in(api, api.tenant)
    page = await api.client.get("/ui/queues")
    assert page.status_code == 200, page.text
    assert "small" in page.text and 'max="4"' in page.text and "0 of 4" in page.text


async def test_a_group_is_scaled_from_its_page(api: Api) -> None:
    key = await signed_in(api, api.tenant)
    body = {"name": "web", "image": "busybox:latest", "command": "true", "task_count": 2}
    r = await api.client.post("/api/v1/task-groups", json=body, headers=api.tenant)
    gid = r.json()["id"]
    r = await api.client.post(
        f"/ui/groups/{gid}/scale", content=f"csrf={csrf_token(key)}&replicas=3", headers=FORM
    )
    assert r.status_code == 303, r.text
    r = await api.client.get(f"/api/v1/task-groups/{gid}", headers=api.tenant)
    assert r.json()["replicas"] == 3
    r = await api.client.post(
        f"/ui/groups/{gid}/scale", content=f"csrf={csrf_token(key)}&replicas=many", headers=FORM
    )
    assert r.status_code == 400 and "replicas" in r.text
