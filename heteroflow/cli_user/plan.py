"""`--plan` on `run`, `groups create` and `jobs submit`: what the submission would do, made
nowhere (POST .../plan, docs/scheduling.md "Plan and ETA"), and `groups create FILE`."""

from __future__ import annotations

import argparse
from typing import Any

from . import output as out
from .client import EXIT_OK, Context
from .jobs import read_document


def plan_text(answer: dict[str, Any]) -> str:
    """Each task's outcome, then its nodes: fits with cards, else the stage that refused."""
    parts: list[str] = []
    for task in answer["tasks"]:
        if task["outcome"] == "placed":
            head = f"{task['name']}: placed on {task['node_id']} ({', '.join(task['gpu_ids'])})"
        else:
            head = f"{task['name']}: {task['outcome']} at {task['stage']} ({task['reason']})"
            head += f": {task['message']}"
        for p in task["preempts"]:
            head += f"\n  would preempt on {p['node_id']}: {', '.join(p['victims'])}"
        adm = task["admission"]
        queue = adm["queue"] or "-"
        head += (
            f"\n  queue {queue}, tenant quota {adm['tenant_quota']:g} "
            f"({adm['tenant_used']:g} held): {'admitted' if adm['admitted'] else adm['message']}"
        )
        pending = task.get("pending")
        if pending:
            eta = pending["eta"]
            when = eta if isinstance(eta, str) else f"{eta['at']} ({eta['low']} – {eta['high']})"
            head += f"\n  position {pending['position']}, eta {when}: {pending['method']}"
        rows = [
            (
                n["node_id"],
                "fits" if n["fits"] else "no",
                "" if n["fits"] else n["stage"],
                ", ".join(n["gpu_ids"]) if n["fits"] else n["message"],
            )
            for n in task["nodes"]
        ]
        more = f"\n  … and {task['nodes_more']} more node(s)" if task["nodes_more"] else ""
        parts.append(head + "\n" + out.table(("NODE", "FITS", "STAGE", "CARDS / WHY"), rows) + more)
    return "\n\n".join(parts)


def show_plan(ctx: Context, path: str, body: Any, params: dict[str, str]) -> int:
    answer = ctx.client.post(f"{path}/plan", body, **params).json()
    ctx.print(plan_text(answer) if ctx.output == "table" else out.render(answer, ctx.output))
    return EXIT_OK  # a plan that finds no place now still answered: `fits` says which


def cmd_groups_create(ctx: Context, args: argparse.Namespace) -> int:
    params = {"tenant_id": args.tenant} if args.tenant else {}
    body = read_document(args.file)
    if args.plan:
        return show_plan(ctx, "/task-groups", body, params)
    group = ctx.client.post("/task-groups", body, **params).json()
    ctx.print(group["id"] if ctx.output == "table" else out.render(group, ctx.output))
    return EXIT_OK
