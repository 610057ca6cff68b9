"""The web console at `/ui/`: server-rendered pages over the gateway's own API.

Every page calls the API in-process (`httpx.ASGITransport` on this app) with the key the user
signed in with, so the console sees exactly what that key may see and every refusal is the
API's own, with its message and field names. The key lives in a session cookie (`HttpOnly`,
`SameSite=Strict`, path `/ui`, `Secure` over HTTPS), never in a URL; every change carries a
CSRF token derived from the key (HMAC) and must come from this origin; every answer carries a
strict Content-Security-Policy (scripts and styles from `/ui/static/` only). Live updates
come over a server-sent-event stream of the console's own (`/ui/tasks/{id}/live`), which the
page's script follows; without scripts every page still works by reloading. The plumbing
(cookie, CSRF, headers, the API client) is web.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from . import groups, jobs
from .charts import gpu_charts
from .forms import task_body
from .views import pool_usage
from .web import (
    COOKIE,
    Form,
    Key,
    api_client,
    create,
    go,
    if_ok,
    not_found,
    ok,
    page,
    read_form,
    same_origin,
    secured,
)

PER_PAGE = 20
LIVE_POLL_S = 0.5
TERMINAL = {"completed", "failed", "stopped", "cancelled", "skipped"}
LIST_FILTERS = ("status", "name", "node_id", "sort", "order")
# The list endpoints behind the plain tables, and the columns a table may show.
SECTIONS = {"groups": "/task-groups", "jobs": "/jobs"}
COLUMNS = ("id", "name", "status", "tenant_id", "task_type", "replicas", "priority", "capacity")
ACTIONS = {
    "stop": ("POST", "/stop"),
    "sleep": ("POST", "/sleep"),
    "wake": ("POST", "/wake"),
    "delete": ("DELETE", ""),
}

router = APIRouter(prefix="/ui", include_in_schema=False)
# Before the routes below: `/ui/groups/new` is not a task action, `/ui/pools` not a listing.
router.include_router(groups.router)
router.include_router(jobs.router)


# -- signing in -------------------------------------------------------------------------------


@router.get("/")
async def home(request: Request) -> Response:
    return go("/ui/tasks" if request.cookies.get(COOKIE) else "/ui/login")


@router.get("/login")
async def login_form(request: Request) -> Response:
    return page(request, "login.html", title="Sign in", error="")


@router.post("/login")
async def login(request: Request) -> Response:
    if not same_origin(request):
        return page(request, "login.html", 403, title="Sign in", error="cross-site sign-in refused")
    key = (await read_form(request)).get("key", "").strip()
    if not key:
        return page(request, "login.html", 401, title="Sign in", error="a key is required")
    async with api_client(request, key) as api:
        r = await api.get("/tasks", params={"per_page": 1})
    if r.status_code in (401, 403):
        return page(request, "login.html", 401, title="Sign in", error=r.json().get("error", ""))
    response = go("/ui/tasks")
    https = request.url.scheme == "https"
    response.set_cookie(COOKIE, key, httponly=True, samesite="strict", path="/ui", secure=https)
    return response


@router.post("/logout")
async def logout(_form: Form) -> Response:
    response = go("/ui/login")
    response.delete_cookie(COOKIE, path="/ui")
    return response


# -- tasks ------------------------------------------------------------------------------------


@router.get("/tasks")
async def tasks(request: Request, key: Key) -> Response:
    query = {k: v for k, v in request.query_params.items() if k in LIST_FILTERS and v}
    page_no = request.query_params.get("page", "1")
    async with api_client(request, key) as api:
        params = query | {"page": page_no, "per_page": str(PER_PAGE)}
        body = ok(request, await api.get("/tasks", params=params))
    pages = max(1, -(-body["total"] // PER_PAGE))
    return page(
        request,
        "tasks.html",
        title="Tasks",
        tasks=body["tasks"],
        total=body["total"],
        page_no=body["page"],
        pages=pages,
        query=query,
        link=lambda n: "/ui/tasks?" + urlencode(query | {"page": n}),
    )


@router.get("/tasks/new")
async def new_task(request: Request, _key: Key) -> Response:
    return page(request, "new_task.html", title="New task", form={}, error="", fields=[])


@router.post("/tasks/new")
async def create_task(request: Request, key: Key, form: Form) -> Response:
    problems = await create(request, key, task_body(form), "/tasks", "/ui/tasks")
    if isinstance(problems, Response):
        return problems
    return page(
        request,
        "new_task.html",
        400,
        title="New task",
        form=form,
        error=problems.get("", ""),
        fields=problems,
    )


@router.get("/tasks/{task_id}")
async def task_detail(request: Request, task_id: str, key: Key) -> Response:
    async with api_client(request, key) as api:
        task = ok(request, await api.get(f"/tasks/{task_id}"))
        timeline = if_ok(await api.get(f"/tasks/{task_id}/events", params={"per_page": 50}))
        retries = if_ok(await api.get(f"/tasks/{task_id}/retries"))
        gpu = if_ok(await api.get(f"/tasks/{task_id}/gpu-metrics"))
        energy = if_ok(await api.get(f"/tasks/{task_id}/energy"))
    return page(
        request,
        "task.html",
        title=task["name"],
        task=task,
        charts=gpu_charts(gpu) if gpu else [],
        energy=energy,
        timeline=(timeline or {}).get("events", []),
        retries=(retries or {}).get("retries", []),
        terminal=task["status"] in TERMINAL,
    )


@router.get("/tasks/{task_id}/timeline")
async def task_timeline(request: Request, task_id: str, key: Key) -> Response:
    """The timeline as an HTML fragment (the live page swaps it in)."""
    async with api_client(request, key) as api:
        body = ok(request, await api.get(f"/tasks/{task_id}/events", params={"per_page": 50}))
    return page(request, "_timeline.html", timeline=body["events"])


@router.get("/tasks/{task_id}/live")
async def task_live(request: Request, task_id: str) -> Response:
    """Server-sent events for the detail page: `status` when it changes, `log` per new line,
    `timeline` when entries were added, `end` once the task is over and its logs are sent."""
    key = request.cookies.get(COOKIE)
    if not key:
        return secured(Response(status_code=401))
    return StreamingResponse(_live(request, key, task_id), media_type="text/event-stream")


async def _live(request: Request, key: str, task_id: str) -> AsyncIterator[str]:
    # Its own client: the stream outlives the handler that returned it.
    status, lines_sent, entries = "", 0, -1
    async with api_client(request, key) as api:
        while not await request.is_disconnected():
            r = await api.get(f"/tasks/{task_id}")
            if r.status_code != 200:
                yield _event("end", {"error": r.json().get("error", "")})
                return
            task = r.json()
            if task["status"] != status:
                status = task["status"]
                yield _event("status", {"status": status, "node_id": task.get("node_id") or ""})
            logs = if_ok(await api.get(f"/tasks/{task_id}/logs", params={"lines": 1000}))
            if logs:
                for line in logs["logs"][lines_sent:]:
                    yield _event("log", {"line": line})
                lines_sent = max(lines_sent, len(logs["logs"]))
            tl = if_ok(await api.get(f"/tasks/{task_id}/events", params={"per_page": 1}))
            if tl and tl["total"] != entries:
                if entries >= 0:
                    yield _event("timeline", {"total": tl["total"]})
                entries = tl["total"]
            if status in TERMINAL:
                yield _event("end", {"status": status})
                return
            await asyncio.sleep(LIVE_POLL_S)


def _event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


@router.get("/tasks/{task_id}/{action}")
async def confirm(request: Request, task_id: str, action: str, _key: Key) -> Response:
    """A confirmation page before any change (works without scripts)."""
    if action not in ACTIONS:
        return not_found(request)
    title = f"{action} {task_id}"
    return page(request, "confirm.html", title=title, task_id=task_id, action=action)


@router.post("/tasks/{task_id}/{action}")
async def act(request: Request, task_id: str, action: str, key: Key, _form: Form) -> Response:
    if action not in ACTIONS:
        return not_found(request, "no such action")
    method, suffix = ACTIONS[action]
    async with api_client(request, key) as api:
        ok(request, await api.request(method, f"/tasks/{task_id}{suffix}"))
    return go("/ui/tasks" if action == "delete" else f"/ui/tasks/{task_id}")


# -- groups, jobs, queues, nodes --------------------------------------------------------------


@router.get("/pools")
async def pools(request: Request, key: Key) -> Response:
    """Each pool's cards, memory and online nodes used against what it has (meters)."""
    async with api_client(request, key) as api:
        listed = ok(request, await api.get("/pools"))["pools"]
    rows = [p | {"usage": pool_usage(p["capacity"])} for p in listed]
    return page(request, "pools.html", title="Pools", pools=rows)


@router.get("/queues")
async def queues(request: Request, key: Key) -> Response:
    """Each queue's usage against its quota (one read per queue: queues are few)."""
    async with api_client(request, key) as api:
        listed = ok(request, await api.get("/queues"))["queues"]
        found = [if_ok(await api.get(f"/queues/{q['name']}")) or q for q in listed]
    return page(request, "queues.html", title="Queues", queues=found)


@router.get("/nodes")
async def nodes(request: Request, key: Key) -> Response:
    async with api_client(request, key) as api:
        body = ok(request, await api.get("/nodes"))
    return page(request, "nodes.html", title="Nodes", nodes=body["nodes"])


@router.get("/{section}")
async def listing(request: Request, section: str, key: Key) -> Response:
    """Groups and jobs: one table each, from their list endpoints, with a create link."""
    if section not in SECTIONS:
        return not_found(request)
    async with api_client(request, key) as api:
        body = ok(request, await api.get(SECTIONS[section]))
    rows = next((v for v in body.values() if isinstance(v, list)), [])
    columns = [c for c in COLUMNS if any(c in x for x in rows)]
    title = section.capitalize()
    new, new_label = f"/ui/{section}/new", f"New {section[:-1]}"
    return page(
        request,
        "listing.html",
        title=title,
        rows=rows,
        columns=columns,
        detail=section,
        new=new,
        new_label=new_label,
    )
