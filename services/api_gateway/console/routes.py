"""The web console at `/ui/`: server-rendered pages over the gateway's own API.

Every page calls the API in-process (`httpx.ASGITransport` on this app) with the key the user
signed in with, so the console sees exactly what that key may see and every refusal is the
API's own, with its message and field names. The key lives in a session cookie (`HttpOnly`,
`SameSite=Strict`, path `/ui`, `Secure` over HTTPS), never in a URL; every change carries a
CSRF token derived from the key (HMAC) and must come from this origin; every answer carries a
strict Content-Security-Policy (scripts and styles from `/ui/static/` only). Live updates
come over a server-sent-event stream of the console's own (`/ui/tasks/{id}/live`), which the
page's script follows; without scripts every page still works by reloading.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from .charts import sparkline
from .forms import task_body

HERE = Path(__file__).parent
STATIC = HERE / "static"
COOKIE = "hf_console"
PER_PAGE = 20
LIVE_POLL_S = 0.5
TERMINAL = {"completed", "failed", "stopped", "cancelled", "skipped"}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

router = APIRouter(prefix="/ui", include_in_schema=False)
templates = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(["html"]),
    enable_async=False,
)


def csrf_token(key: str) -> str:
    return hmac.new(key.encode(), b"heteroflow-console-csrf", hashlib.sha256).hexdigest()[:32]


def _headers(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    # same-origin, not no-referrer: with no-referrer a browser sends `Origin: null` on form
    # posts, and the origin check below could not tell ours from a forgery.
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Cache-Control"] = "no-store"
    return response


def page(request: Request, name: str, status: int = 200, **context: Any) -> Response:
    key = request.cookies.get(COOKIE, "")
    html = templates.get_template(name).render(
        csrf=csrf_token(key) if key else "", signed_in=bool(key), **context
    )
    return _headers(HTMLResponse(html, status))


def _api(request: Request, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=request.app),
        base_url="http://console/api/v1",
        headers={"Authorization": f"Bearer {key}"},
        timeout=httpx.Timeout(10.0),
    )


def _to_login() -> Response:
    return _headers(RedirectResponse("/ui/login", 303))


def _same_origin(request: Request) -> bool:
    """A change must come from this origin (checked beside the CSRF token)."""
    origin = request.headers.get("origin")
    if origin is None:
        return request.headers.get("sec-fetch-site", "same-origin") == "same-origin"
    return origin == f"{request.url.scheme}://{request.url.netloc}"


async def _checked_form(request: Request) -> tuple[str, dict[str, str]] | Response:
    """The session key and the posted form, or the refusal page."""
    key = request.cookies.get(COOKIE, "")
    if not key:
        return _to_login()
    form = await _form(request)
    token = form.pop("csrf", "")
    if not _same_origin(request) or not hmac.compare_digest(token, csrf_token(key)):
        return page(
            request,
            "error.html",
            403,
            title="Refused",
            message="the form's security token is missing or stale: reload the page",
        )
    return key, form


async def _form(request: Request) -> dict[str, str]:
    """An urlencoded form (what the console's pages post); anything else reads as empty."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/x-www-form-urlencoded":
        return {}
    try:
        text = (await request.body()).decode("utf-8")
    except UnicodeDecodeError:
        return {}
    return dict(parse_qsl(text, keep_blank_values=True))


# -- signing in -------------------------------------------------------------------------------


@router.get("/")
async def home(request: Request) -> Response:
    return _headers(
        RedirectResponse("/ui/tasks" if request.cookies.get(COOKIE) else "/ui/login", 303)
    )


@router.get("/login")
async def login_form(request: Request) -> Response:
    return page(request, "login.html", title="Sign in", error="")


@router.post("/login")
async def login(request: Request) -> Response:
    if not _same_origin(request):
        return page(request, "login.html", 403, title="Sign in", error="cross-site sign-in refused")
    key = (await _form(request)).get("key", "").strip()
    async with _api(request, key) as api:
        r = await api.get("/tasks", params={"per_page": 1}) if key else None
    if r is None or r.status_code in (401, 403):
        detail = r.json().get("error", "") if r is not None else "a key is required"
        return page(request, "login.html", 401, title="Sign in", error=detail)
    response = RedirectResponse("/ui/tasks", 303)
    response.set_cookie(
        COOKIE,
        key,
        httponly=True,
        samesite="strict",
        path="/ui",
        secure=request.url.scheme == "https",
    )
    return _headers(response)


@router.post("/logout")
async def logout(request: Request) -> Response:
    checked = await _checked_form(request)
    if isinstance(checked, Response):
        return checked
    response = RedirectResponse("/ui/login", 303)
    response.delete_cookie(COOKIE, path="/ui")
    return _headers(response)


# -- tasks ------------------------------------------------------------------------------------


LIST_FILTERS = ("status", "name", "node_id", "sort", "order")


@router.get("/tasks")
async def tasks(request: Request) -> Response:
    key = request.cookies.get(COOKIE)
    if not key:
        return _to_login()
    query = {k: v for k, v in request.query_params.items() if k in LIST_FILTERS and v}
    page_no = request.query_params.get("page", "1")
    async with _api(request, key) as api:
        r = await api.get("/tasks", params=query | {"page": page_no, "per_page": PER_PAGE})
    if r.status_code != 200:
        return _refused(request, r)
    body = r.json()
    pages = max(1, -(-body["total"] // PER_PAGE))
    link = lambda n: "/ui/tasks?" + urlencode(query | {"page": n})  # noqa: E731
    return page(
        request,
        "tasks.html",
        title="Tasks",
        tasks=body["tasks"],
        total=body["total"],
        page_no=body["page"],
        pages=pages,
        query=query,
        link=link,
    )


@router.get("/tasks/new")
async def new_task(request: Request) -> Response:
    if not request.cookies.get(COOKIE):
        return _to_login()
    return page(request, "new_task.html", title="New task", form={}, error="", fields=[])


@router.post("/tasks/new")
async def create_task(request: Request) -> Response:
    checked = await _checked_form(request)
    if isinstance(checked, Response):
        return checked
    key, form = checked
    body, problems = task_body(form)
    if not problems:
        async with _api(request, key) as api:
            r = await api.post("/tasks", json=body)
        if r.status_code == 201:
            return _headers(RedirectResponse(f"/ui/tasks/{r.json()['id']}", 303))
        problem = r.json()
        problems = {f.split(".")[0]: problem.get("error", "") for f in problem.get("fields", [])}
        problems = problems or {"": problem.get("error", r.text)}
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
async def task_detail(request: Request, task_id: str) -> Response:
    key = request.cookies.get(COOKIE)
    if not key:
        return _to_login()
    async with _api(request, key) as api:
        r = await api.get(f"/tasks/{task_id}")
        if r.status_code != 200:
            return _refused(request, r)
        timeline = await api.get(f"/tasks/{task_id}/events", params={"per_page": 50})
        retries = await api.get(f"/tasks/{task_id}/retries")
        gpu = await api.get(f"/tasks/{task_id}/gpu-metrics")
        energy = await api.get(f"/tasks/{task_id}/energy")
    return page(
        request,
        "task.html",
        title=r.json()["name"],
        task=r.json(),
        charts=gpu_charts(gpu.json()) if gpu.status_code == 200 else [],
        energy=energy.json() if energy.status_code == 200 else None,
        timeline=timeline.json().get("events", []) if timeline.status_code == 200 else [],
        retries=retries.json().get("retries", []) if retries.status_code == 200 else [],
        terminal=r.json()["status"] in TERMINAL,
    )


def gpu_charts(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Per card: utilisation and memory over the last hour, as inline SVG."""
    out = []
    for s in body.get("series", []):
        pts = s["points"]
        total = max((p["memory_total_mb"] for p in pts), default=0.0)
        out.append(
            {
                "gpu_id": s["gpu_id"],
                "utilization": Markup(
                    sparkline([p["utilization_pct"] for p in pts], 100, "utilisation %")
                ),
                "memory": Markup(sparkline([p["memory_used_mb"] for p in pts], total, "memory MB")),
            }
        )
    return out


@router.get("/tasks/{task_id}/timeline")
async def task_timeline(request: Request, task_id: str) -> Response:
    """The timeline as an HTML fragment (the live page swaps it in)."""
    key = request.cookies.get(COOKIE)
    if not key:
        return _to_login()
    async with _api(request, key) as api:
        r = await api.get(f"/tasks/{task_id}/events", params={"per_page": 50})
    if r.status_code != 200:
        return _refused(request, r)
    return page(request, "_timeline.html", timeline=r.json()["events"])


@router.get("/tasks/{task_id}/live")
async def task_live(request: Request, task_id: str) -> Response:
    """Server-sent events for the detail page: `status` when it changes, `log` per new line,
    `timeline` when entries were added, `end` once the task is over and its logs are sent."""
    key = request.cookies.get(COOKIE)
    if not key:
        return _headers(Response(status_code=401))
    return StreamingResponse(_live(request, key, task_id), media_type="text/event-stream")


async def _live(request: Request, key: str, task_id: str) -> AsyncIterator[str]:
    status, lines_sent, entries = "", 0, -1
    async with _api(request, key) as api:
        while not await request.is_disconnected():
            r = await api.get(f"/tasks/{task_id}")
            if r.status_code != 200:
                yield _event("end", {"error": r.json().get("error", "")})
                return
            task = r.json()
            if task["status"] != status:
                status = task["status"]
                yield _event("status", {"status": status, "node_id": task.get("node_id") or ""})
            logs = await api.get(f"/tasks/{task_id}/logs", params={"lines": 1000})
            if logs.status_code == 200:
                for line in logs.json()["logs"][lines_sent:]:
                    yield _event("log", {"line": line})
                lines_sent = max(lines_sent, len(logs.json()["logs"]))
            tl = await api.get(f"/tasks/{task_id}/events", params={"per_page": 1})
            if tl.status_code == 200 and tl.json()["total"] != entries:
                if entries >= 0:
                    yield _event("timeline", {"total": tl.json()["total"]})
                entries = tl.json()["total"]
            if status in TERMINAL:
                yield _event("end", {"status": status})
                return
            await asyncio.sleep(LIVE_POLL_S)


def _event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


ACTIONS = {
    "stop": ("post", "/stop"),
    "sleep": ("post", "/sleep"),
    "wake": ("post", "/wake"),
    "delete": ("delete", ""),
}


@router.get("/tasks/{task_id}/{action}")
async def confirm(request: Request, task_id: str, action: str) -> Response:
    """A confirmation page before any change (works without scripts)."""
    if action not in ACTIONS:
        return page(request, "error.html", 404, title="Not found", message="no such page")
    if not request.cookies.get(COOKIE):
        return _to_login()
    return page(
        request, "confirm.html", title=f"{action} {task_id}", task_id=task_id, action=action
    )


@router.post("/tasks/{task_id}/{action}")
async def act(request: Request, task_id: str, action: str) -> Response:
    checked = await _checked_form(request)
    if isinstance(checked, Response):
        return checked
    if action not in ACTIONS:
        return page(request, "error.html", 404, title="Not found", message="no such action")
    method, suffix = ACTIONS[action]
    async with _api(request, checked[0]) as api:
        r = await api.request(method.upper(), f"/tasks/{task_id}{suffix}")
    if r.status_code >= 400:
        return _refused(request, r)
    return _headers(
        RedirectResponse("/ui/tasks" if action == "delete" else f"/ui/tasks/{task_id}", 303)
    )


# -- operators and the rest -------------------------------------------------------------------


@router.get("/nodes")
async def nodes(request: Request) -> Response:
    key = request.cookies.get(COOKIE)
    if not key:
        return _to_login()
    async with _api(request, key) as api:
        r = await api.get("/nodes")
    if r.status_code != 200:
        return _refused(request, r)
    return page(request, "nodes.html", title="Nodes", nodes=r.json()["nodes"])


@router.get("/groups/{group_id}")
async def group_detail(request: Request, group_id: str) -> Response:
    """Members by rank, serving figures, rollout progress, window and timeline."""
    key = request.cookies.get(COOKIE)
    if not key:
        return _to_login()
    async with _api(request, key) as api:
        r = await api.get(f"/task-groups/{group_id}")
        if r.status_code != 200:
            return _refused(request, r)
        extra = {
            name: (await api.get(f"/task-groups/{group_id}{path}", params=params))
            for name, path, params in (
                ("serving", "/serving", {}),
                ("rollout", "/rollout", {}),
                ("timeline", "/events", {"per_page": 50}),
            )
        }
    found = {k: v.json() for k, v in extra.items() if v.status_code == 200}
    group = r.json()
    members = sorted(group.get("tasks", []), key=lambda t: (t.get("rank") is None, t.get("rank")))
    return page(
        request,
        "group.html",
        title=group["name"],
        group=group,
        members=members,
        serving=found.get("serving"),
        rollout=found.get("rollout"),
        timeline=found.get("timeline", {}).get("events", []),
    )


@router.post("/groups/{group_id}/scale")
async def group_scale(request: Request, group_id: str) -> Response:
    checked = await _checked_form(request)
    if isinstance(checked, Response):
        return checked
    key, form = checked
    raw = form.get("replicas", "").strip()
    replicas: int | str = int(raw) if raw.isdigit() else raw
    async with _api(request, key) as api:
        r = await api.post(f"/task-groups/{group_id}/scale", json={"replicas": replicas})
    if r.status_code >= 400:
        return _refused(request, r)
    return _headers(RedirectResponse(f"/ui/groups/{group_id}", 303))


@router.get("/jobs/{job_id}")
async def job_detail(request: Request, job_id: str) -> Response:
    """The job's DAG drawn by depth: each task with its status and why it waits."""
    key = request.cookies.get(COOKIE)
    if not key:
        return _to_login()
    async with _api(request, key) as api:
        r = await api.get(f"/jobs/{job_id}")
    if r.status_code != 200:
        return _refused(request, r)
    job = r.json()
    return page(request, "job.html", title=job["name"], job=job, levels=dag_levels(job["tasks"]))


def dag_levels(nodes: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The job's tasks by depth: a task sits one level below its deepest upstream."""
    upstream = {n["key"]: [str(d["on"]) for d in n["depends_on"]] for n in nodes}
    depth: dict[str, int] = {}

    def level(key: str, seen: frozenset[str] = frozenset()) -> int:
        if key not in depth:
            ups = [u for u in upstream.get(key, []) if u in upstream and u not in seen]
            depth[key] = 1 + max((level(u, seen | {key}) for u in ups), default=-1)
        return depth[key]

    levels: list[list[dict[str, Any]]] = []
    for n in nodes:
        d = level(n["key"])
        while len(levels) <= d:
            levels.append([])
        levels[d].append(n | {"after": upstream[n["key"]]})
    return levels


@router.get("/queues")
async def queues(request: Request) -> Response:
    """Each queue's usage against its quota (one read per queue: queues are few)."""
    key = request.cookies.get(COOKIE)
    if not key:
        return _to_login()
    async with _api(request, key) as api:
        r = await api.get("/queues")
        if r.status_code != 200:
            return _refused(request, r)
        found = []
        for q in r.json()["queues"]:
            one = await api.get(f"/queues/{q['name']}")
            found.append(one.json() if one.status_code == 200 else q)
    return page(request, "queues.html", title="Queues", queues=found)


@router.get("/{section}")
async def listing(request: Request, section: str) -> Response:
    """Groups, jobs, queues and pools: one table each, from their list endpoints."""
    paths = {"groups": "/task-groups", "jobs": "/jobs", "queues": "/queues", "pools": "/pools"}
    if section not in paths:
        return page(request, "error.html", 404, title="Not found", message="no such page")
    key = request.cookies.get(COOKIE)
    if not key:
        return _to_login()
    async with _api(request, key) as api:
        r = await api.get(paths[section])
    if r.status_code != 200:
        return _refused(request, r)
    body = r.json()
    rows = next((v for v in body.values() if isinstance(v, list)), [])
    columns = [
        c
        for c in (
            "id",
            "name",
            "status",
            "tenant_id",
            "task_type",
            "replicas",
            "priority",
            "policy",
            "max_gpus",
            "capacity",
        )
        if any(c in x for x in rows)
    ]
    detail = section if section in ("groups", "jobs") else ""
    return page(
        request,
        "listing.html",
        title=section.capitalize(),
        rows=rows,
        columns=columns,
        detail=detail,
    )


def _refused(request: Request, r: httpx.Response) -> Response:
    if r.status_code == 401:
        response = _to_login()
        response.delete_cookie(COOKIE, path="/ui")
        return response
    try:
        message = r.json().get("error", r.text)
    except ValueError:
        message = r.text
    titles = {403: "Not allowed", 404: "Not found"}
    return page(
        request,
        "error.html",
        r.status_code,
        title=titles.get(r.status_code, "Refused"),
        message=message,
    )
