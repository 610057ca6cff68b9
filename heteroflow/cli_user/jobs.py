"""`heteroflow jobs ...`, `heteroflow queues ...`, `heteroflow pools ...` (seed 004).

Jobs, queues and pools are submitted as JSON documents (a file, or `-` for stdin) in the
shape of the HTTP API (docs/jobs.md, docs/queues.md); the commands show them as tables.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from . import output as out
from .client import Context, UsageError

EXIT_OK = 0
JOBS = "/jobs"

Handler = Callable[[Context, argparse.Namespace], int]


def read_document(path: str) -> Any:
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{path}: not JSON ({exc})") from None


def _show(ctx: Context, data: Any, text: Callable[[Any], str]) -> int:
    ctx.print(text(data) if ctx.output == "table" else out.render(data, ctx.output))
    return EXIT_OK


# --- jobs ----------------------------------------------------------------------------------


def jobs_table(jobs: list[dict[str, Any]]) -> str:
    rows = [
        (j["id"], j["name"], j["status"], j["queue"] or "-", out.age(j["created_at"])) for j in jobs
    ]
    return out.table(("ID", "NAME", "STATUS", "QUEUE", "AGE"), rows)


def _why(job: dict[str, Any]) -> str:
    """` (reason)`; a pending job's with its code first (`queue_quota_exceeded: ...`)."""
    if not job.get("reason"):
        return ""
    code = job.get("reason_code") if job["status"] == "pending" else None
    return f" ({code}: {job['reason']})" if code else f" ({job['reason']})"


def dag_text(job: dict[str, Any]) -> str:
    head = out.fields(
        [
            ("Job", job["id"]),
            ("Name", job["name"]),
            ("Status", job["status"] + _why(job)),
            ("Queue", job["queue"] or "-"),
        ]
    )
    rows = []
    for node in job.get("tasks", []):
        task = node.get("task") or {}
        deps = ", ".join(f"{d.get('kind', 'after')}:{d['on']}" for d in node["depends_on"])
        rows.append(
            (
                node["key"],
                node["status"],
                deps or "-",
                task.get("id", "-"),
                out.short_time(task.get("started_at")) or "-",
                out.short_time(task.get("finished_at")) or "-",
                node.get("why") or "",
            )
        )
    headers = ("KEY", "STATUS", "AFTER", "TASK", "STARTED", "FINISHED", "WHY")
    return head + "\n\n" + out.table(headers, rows)


def cmd_jobs_submit(ctx: Context, args: argparse.Namespace) -> int:
    params = {"tenant_id": args.tenant} if args.tenant else {}
    if getattr(args, "plan", False):
        from .plan import show_plan  # plan.py reads documents with this module's reader

        return show_plan(ctx, JOBS, read_document(args.file), params)
    job = ctx.client.post(JOBS, read_document(args.file), **params).json()
    return _show(ctx, job, dag_text)


def cmd_jobs_ls(ctx: Context, args: argparse.Namespace) -> int:
    params = {"status": args.status} if args.status else {}
    jobs = ctx.client.get(JOBS, per_page=200, **params)["jobs"]
    return _show(ctx, jobs, jobs_table)


def cmd_jobs_describe(ctx: Context, args: argparse.Namespace) -> int:
    path, as_of = f"{JOBS}/{quote(args.job_id, safe='')}", getattr(args, "as_of", None)
    return _show(
        ctx, ctx.client.get(path, as_of=as_of) if as_of else ctx.client.get(path), dag_text
    )


def cmd_jobs_events(ctx: Context, args: argparse.Namespace) -> int:
    events = ctx.client.get(f"{JOBS}/{quote(args.job_id, safe='')}/events")["events"]

    def text(items: list[dict[str, Any]]) -> str:
        rows = [(e["version"], out.short_time(e["occurred_at"]), e["type"]) for e in items]
        return out.table(("#", "TIME", "EVENT"), rows)

    return _show(ctx, events, text)


def cmd_jobs_stop(ctx: Context, args: argparse.Namespace) -> int:
    job = ctx.client.post(f"{JOBS}/{quote(args.job_id, safe='')}/stop").json()
    return _show(ctx, job, dag_text)


def cmd_jobs_rm(ctx: Context, args: argparse.Namespace) -> int:
    ctx.client.delete(f"{JOBS}/{quote(args.job_id, safe='')}")
    ctx.note(f"deleted {args.job_id}")
    return EXIT_OK


# --- queues and pools -----------------------------------------------------------------------


def queues_table(queues: list[dict[str, Any]]) -> str:
    rows = []
    for q in queues:
        quota = q["quota"]
        limits = ", ".join(f"{k}={v}" for k, v in quota.items() if v) or "none"
        rows.append(
            (q["name"], q["tenant"], ",".join(q["pools"]), limits, q["priority"], q["policy"])
        )
    return out.table(("NAME", "TENANT", "POOLS", "QUOTA", "PRIORITY", "POLICY"), rows)


def _of(usage: dict[str, Any], quota: dict[str, Any], used: str, limit: str) -> str:
    return f"{usage.get(used, 0):g} of {quota[limit] or 'unlimited'}"


def queue_text(q: dict[str, Any]) -> str:
    usage, quota = q.get("usage", {}), q["quota"]
    policy = f"{q['policy']}, priority {q['priority']}" + (", default" if q["default"] else "")
    return out.fields(
        [
            ("Queue", q["name"]),
            ("Tenant", q["tenant"]),
            ("Pools", ", ".join(q["pools"])),
            ("Policy", policy),
            ("GPUs", _of(usage, quota, "gpus", "max_gpus")),
            ("Running tasks", _of(usage, quota, "running_tasks", "max_running_tasks")),
            ("Running jobs", _of(usage, quota, "running_jobs", "max_running_jobs")),
            ("Pending", q.get("pending", 0)),
        ]
    )


def pools_table(pools: list[dict[str, Any]]) -> str:
    rows = []
    for p in pools:
        cap, sel = p["capacity"], p["node_selector"]
        selector = ", ".join([f"gpu_type={sel['gpu_type']}"] if sel["gpu_type"] else [])
        selector += "".join(f", {k}={v}" for k, v in sel["labels"].items()).lstrip(", ")
        gpus = f"{cap['free_gpus']}/{cap['total_gpus']}"
        rows.append((p["name"], selector or "(all nodes)", cap["online_nodes"], gpus))
    return out.table(("NAME", "SELECTOR", "NODES", "FREE GPUS"), rows)


def pool_text(p: dict[str, Any]) -> str:
    nodes = [
        (
            n["id"],
            n["status"],
            ",".join(n["gpu_models"]) or "-",
            f"{n['used_gpus']}/{n['total_gpus']}",
            n["tasks"],
        )
        for n in p.get("nodes", [])
    ]
    return pools_table([p]) + "\n\n" + out.table(("NODE", "STATUS", "GPUS", "USED", "TASKS"), nodes)


def resource_commands(
    base: str, one: Callable[[Any], str], many: Callable[[Any], str]
) -> dict[str, Handler]:
    """ls / describe / create / update / rm for /queues or /pools."""
    key = base.strip("/")

    def ls(ctx: Context, args: argparse.Namespace) -> int:
        return _show(ctx, ctx.client.get(base)[key], many)

    def describe(ctx: Context, args: argparse.Namespace) -> int:
        return _show(ctx, ctx.client.get(f"{base}/{quote(args.name, safe='')}"), one)

    def create(ctx: Context, args: argparse.Namespace) -> int:
        return _show(ctx, ctx.client.post(base, read_document(args.file)).json(), one)

    def update(ctx: Context, args: argparse.Namespace) -> int:
        path = f"{base}/{quote(args.name, safe='')}"
        response = ctx.client.request("PUT", path, body=read_document(args.file))
        return _show(ctx, response.json(), one)

    def rm(ctx: Context, args: argparse.Namespace) -> int:
        ctx.client.delete(f"{base}/{quote(args.name, safe='')}")
        ctx.note(f"deleted {args.name}")
        return EXIT_OK

    return {"ls": ls, "describe": describe, "create": create, "update": update, "rm": rm}


QUEUE_COMMANDS = resource_commands("/queues", queue_text, queues_table)
POOL_COMMANDS = resource_commands("/pools", pool_text, pools_table)
