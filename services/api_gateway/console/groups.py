"""The console's group pages: the create form, a group's page (state, members by rank,
serving figures as charts, schedule window, rollout progress by generation, timeline), and
the changes made from it (scale, and the rollout's start, partition, pause, resume,
rollback), each a form post with the CSRF token, the rollout's behind a confirmation page.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .charts import serving_charts
from .forms import field_problems, group_body, rollout_body
from .views import FigureLog, window_state
from .web import Form, Key, api_client, create, go, if_ok, not_found, ok, page

router = APIRouter()
# What each rollout action asks for, and in which phases the page offers it.
ROLLOUT_ACTIONS = {
    "start": ("Start a rollout", ("image", "partition", "max_surge", "max_unavailable")),
    "partition": ("Move the canary partition", ("partition",)),
    "pause": ("Pause the rollout", ()),
    "resume": ("Resume the rollout", ()),
    "rollback": ("Roll back", ()),
}
OFFERED = {
    None: ("start",),
    "running": ("pause", "rollback", "partition"),
    "paused": ("resume", "rollback", "partition"),
    "rollback": (),
}
PARALLELISM = ("split", "data_parallel", "tensor_parallel", "pipeline_parallel")


@router.get("/groups/new")
async def new_group(request: Request, _key: Key) -> Response:
    return _group_form(request, {}, {}, 200)


@router.post("/groups/new")
async def create_group(request: Request, key: Key, form: Form) -> Response:
    problems = await create(request, key, group_body(form), "/task-groups", "/ui/groups")
    if isinstance(problems, Response):
        return problems
    return _group_form(request, form, problems, 400)


def _group_form(
    request: Request, form: dict[str, str], problems: dict[str, str], status: int
) -> Response:
    return page(
        request,
        "new_group.html",
        status,
        title="New group",
        form=form,
        error=problems.get("", ""),
        fields=problems,
        parallelism=PARALLELISM,
    )


@router.get("/groups/{group_id}")
async def group_detail(request: Request, group_id: str, key: Key) -> Response:
    """Members by rank, serving figures, rollout progress, window and timeline."""
    base = f"/task-groups/{group_id}"
    async with api_client(request, key) as api:
        group = ok(request, await api.get(base))
        serving = if_ok(await api.get(f"{base}/serving"))
        rollout = if_ok(await api.get(f"{base}/rollout"))
        timeline = if_ok(await api.get(f"{base}/events", params={"per_page": 50}))
    members = sorted(group.get("tasks", []), key=lambda t: (t.get("rank") is None, t.get("rank")))
    samples = _figures(request).add(group_id, serving) if serving else []
    phase = rollout.get("phase") if rollout else None
    return page(
        request,
        "group.html",
        title=group["name"],
        group=group,
        members=members,
        serving=serving,
        charts=serving_charts(samples),
        samples=len(samples),
        window=window_state(group.get("schedule_window"), datetime.now(UTC)),
        rollout=rollout,
        offered=[(a, ROLLOUT_ACTIONS[a][0]) for a in OFFERED.get(phase, ("start",))],
        timeline=(timeline or {}).get("events", []),
    )


def _figures(request: Request) -> FigureLog:
    figures = getattr(request.app.state, "console_figures", None)
    if figures is None:
        figures = request.app.state.console_figures = FigureLog()
    return figures


@router.post("/groups/{group_id}/scale")
async def group_scale(request: Request, group_id: str, key: Key, form: Form) -> Response:
    raw = form.get("replicas", "").strip()
    replicas: int | str = int(raw) if raw.isdigit() else raw  # the API names a bad value
    async with api_client(request, key) as api:
        r = await api.post(f"/task-groups/{group_id}/scale", json={"replicas": replicas})
    ok(request, r)
    return go(f"/ui/groups/{group_id}")


@router.get("/groups/{group_id}/rollout/{action}")
async def rollout_confirm(request: Request, group_id: str, action: str, key: Key) -> Response:
    """The confirmation page of a rollout action (with its fields, for start and partition)."""
    if action not in ROLLOUT_ACTIONS:
        return not_found(request)
    async with api_client(request, key) as api:
        group = ok(request, await api.get(f"/task-groups/{group_id}"))
    return _rollout_page(request, group, action, {}, {}, 200)


@router.post("/groups/{group_id}/rollout/{action}")
async def rollout_act(
    request: Request, group_id: str, action: str, key: Key, form: Form
) -> Response:
    if action not in ROLLOUT_ACTIONS:
        return not_found(request, "no such action")
    body, problems = rollout_body(form)
    if not problems:
        path = f"/task-groups/{group_id}/rollout"
        async with api_client(request, key) as api:
            if action in ("start", "partition"):
                r = await api.post(path, json=_only(body, ROLLOUT_ACTIONS[action][1]))
            else:
                r = await api.post(f"{path}/{action}")
            if r.status_code in (200, 202):
                return go(f"/ui/groups/{group_id}")
            if r.status_code != 400 or action not in ("start", "partition"):
                ok(request, r)  # the API's refusal as a page
            problems = field_problems(r.json(), r.text)
            group = ok(request, await api.get(f"/task-groups/{group_id}"))
    else:
        async with api_client(request, key) as api:
            group = ok(request, await api.get(f"/task-groups/{group_id}"))
    return _rollout_page(request, group, action, form, problems, 400)


def _only(body: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k in names}


def _rollout_page(
    request: Request,
    group: dict[str, Any],
    action: str,
    form: dict[str, str],
    problems: dict[str, str],
    status: int,
) -> Response:
    title, names = ROLLOUT_ACTIONS[action]
    return page(
        request,
        "rollout_action.html",
        status,
        title=f"{title}: {group['name']}",
        group=group,
        action=action,
        names=names,
        form=form,
        error=problems.get("", ""),
        fields=problems,
    )
