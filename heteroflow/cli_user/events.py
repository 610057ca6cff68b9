"""Operations views: a task's fault-tolerance timeline, the node inventory, task groups.

The timeline and group endpoints are newer than some servers; a server without them answers
a framework 404, which is reported as a missing endpoint rather than a missing task.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from . import output as out
from .client import API_PREFIX, EXIT_OK, ApiError, Client, Context, Missing

GROUPS = "/task-groups"
TIMELINE_PAGE = 200  # the API's ceiling per page, and the most it keeps per task
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def event_items(data: Any) -> list[dict[str, Any]]:
    """The events of a timeline answer: a bare list, or the list under a known key."""
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        for key in ("events", "timeline", "items"):
            if isinstance(data.get(key), list):
                return list(data[key])
    return []


def fetch_timeline(client: Client, path: str) -> list[dict[str, Any]] | None:
    """Every event of a timeline (`{path}/events`), oldest first; None when this server has no
    timeline endpoint. The API pages newest first, at most 200 a page."""
    events: list[dict[str, Any]] = []
    page = 1
    while True:
        try:
            data = client.get(f"{path}/events", page=page, per_page=TIMELINE_PAGE)
        except ApiError as exc:
            if exc.route_missing:
                return None
            raise
        batch = event_items(data)
        events.extend(batch)
        total = int(data.get("total") or 0) if isinstance(data, dict) else 0
        if not batch or len(events) >= total:
            break
        page += 1
    events.reverse()  # ties in time keep the server's order, oldest first
    return sorted(events, key=lambda e: out.parse_time(out.event_time(e)) or EPOCH)


def _show_timeline(ctx: Context, path: str, what: str) -> int:
    ctx.client.get(path)  # a missing task or group is named as such, not as a missing endpoint
    events = fetch_timeline(ctx.client, path)
    if events is None:
        raise Missing(
            f"the server at {ctx.client.target.server} has no GET {API_PREFIX}{path}/events"
            " endpoint; it is older than this client"
        )
    if ctx.output != "table":
        ctx.print(out.render(events, ctx.output))
    elif not events:
        ctx.note(f"No timeline events for {what}.")
    else:
        ctx.print(out.timeline_table(events))
    return EXIT_OK


def cmd_events(ctx: Context, args: argparse.Namespace) -> int:
    return _show_timeline(ctx, f"/tasks/{quote(args.task_id, safe='')}", args.task_id)


def cmd_groups_events(ctx: Context, args: argparse.Namespace) -> int:
    return _show_timeline(ctx, f"{GROUPS}/{quote(args.group_id, safe='')}", args.group_id)


# --- nodes --------------------------------------------------------------------------------


def nodes_table(nodes: list[dict[str, Any]]) -> str:
    rows = []
    for n in nodes:
        inventory = n.get("inventory") or {}
        rows.append(
            (
                n.get("id"),
                n.get("status"),
                out.node_runtime(n),
                out.node_gpus(n),
                out.mebibytes(inventory.get("memory_mb")),
                inventory.get("cpu_cores"),
                n.get("excluded_gpus"),
                [q.get("gpu_id") for q in n.get("quarantined_gpus") or []],
            )
        )
    return out.table(
        ("ID", "STATUS", "RUNTIME", "GPUS", "MEMORY", "CPU", "EXCLUDED", "QUARANTINED"), rows
    )


def cmd_nodes(ctx: Context, args: argparse.Namespace) -> int:
    nodes = ctx.client.get("/nodes").get("nodes") or []
    if ctx.output != "table":
        ctx.print(out.render(nodes, ctx.output))
    elif not nodes:
        ctx.note("No nodes registered.")
    else:
        ctx.print(nodes_table(nodes))
    return EXIT_OK


# --- task groups ------------------------------------------------------------------------------


def list_groups(ctx: Context, status: str | None = None) -> list[dict[str, Any]]:
    params = {"status": status} if status else {}
    data = ctx.client.get(GROUPS, **params)
    groups = list(data) if isinstance(data, list) else list(data.get("groups") or [])
    page, total = 1, int(data.get("total") or 0) if isinstance(data, dict) else 0
    while isinstance(data, dict) and data.get("per_page") and len(groups) < total:
        page += 1
        data = ctx.client.get(GROUPS, page=page, per_page=data["per_page"], **params)
        if not data.get("groups"):
            break
        groups.extend(data["groups"])
    return groups


def _task_count(group: dict[str, Any]) -> Any:
    if group.get("task_count") is not None:
        return group["task_count"]
    return len(group["tasks"]) if isinstance(group.get("tasks"), list) else None


def groups_table(groups: list[dict[str, Any]]) -> str:
    rows = [
        (
            g.get("id"),
            g.get("name"),
            g.get("status"),
            _task_count(g),
            g.get("task_type"),
            out.age(g.get("created_at")),
        )
        for g in groups
    ]
    return out.table(("ID", "NAME", "STATUS", "TASKS", "TYPE", "AGE"), rows)


def group_text(group: dict[str, Any]) -> str:
    """Every scalar field the server sends, in its order, then the member tasks."""
    pairs = [
        (
            "ID" if key == "id" else key.replace("_", " ").capitalize(),
            out.when(value) if key.endswith("_at") else value,
        )
        for key, value in group.items()
        if key != "tasks" and (not isinstance(value, dict | list) or key == "labels")
    ]
    tasks = group.get("tasks") or []
    rows = [
        (
            t.get("id"),
            t.get("rank"),
            t.get("status"),
            t.get("node_id"),
            out.task_gpus(t),
            out.age(t.get("created_at")),
        )
        for t in sorted(tasks, key=lambda t: (t.get("rank") is None, t.get("rank") or 0))
    ]
    body = out.table(("ID", "RANK", "STATUS", "NODE", "GPUS", "AGE"), rows) if rows else "none"
    lines = "\n".join("  " + line for line in body.splitlines())
    return f"{out.fields(pairs)}\n\nTasks:\n{lines}"


def cmd_groups_ls(ctx: Context, args: argparse.Namespace) -> int:
    groups = list_groups(ctx, args.status)
    if ctx.output != "table":
        ctx.print(out.render(groups, ctx.output))
    elif not groups:
        ctx.note("No task groups.")
    else:
        ctx.print(groups_table(groups))
    return EXIT_OK


def cmd_groups_describe(ctx: Context, args: argparse.Namespace) -> int:
    path, as_of = f"{GROUPS}/{quote(args.group_id, safe='')}", getattr(args, "as_of", None)
    group = ctx.client.get(path, as_of=as_of) if as_of else ctx.client.get(path)
    ctx.print(group_text(group) if ctx.output == "table" else out.render(group, ctx.output))
    return EXIT_OK


def cmd_groups_operate(ctx: Context, args: argparse.Namespace) -> int:
    from .commands import operate  # commands imports this module: import at call time

    return operate(ctx, GROUPS, args.group_ids, args.op)
