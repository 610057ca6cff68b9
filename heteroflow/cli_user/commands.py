"""Task commands: run, ps, describe, logs, stop/sleep/wake/rm, retries, stats.

Each handler takes the command's `Context` and its parsed arguments and returns the exit code;
refusals travel as `CliError` and are printed by the caller.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from datetime import datetime
from typing import Any, TextIO
from urllib.parse import quote

from . import output as out
from .client import EXIT_FAILED, EXIT_OK, ApiError, CliError, Context, UsageError
from .events import fetch_timeline
from .plan import show_plan

TERMINAL = ("completed", "failed", "cancelled", "stopped")
UNSTARTED = ("pending", "scheduled")  # placed perhaps, but the node has no output yet
STATUS_ORDER = (
    *("pending", "scheduled", "starting", "running", "sleeping", "waking", "stopping"),
    *("draining", "preempting", "paused", "completed", "failed", "cancelled", "stopped"),
)
POLL_S = 0.3
DECISION_WAIT_S = 20.0  # how long a failed task may wait for the retry engine's verdict
ALL_LINES = 100_000  # the API's ceiling for `lines`
NOT_PLACED = 40030  # logs of a task that has no node yet


def task_path(task_id: str) -> str:
    return f"/tasks/{quote(task_id, safe='')}"


# --- run ----------------------------------------------------------------------------------


def default_name(image: str) -> str:
    """`registry/ns/pytorch:2.3` → `pytorch`, as docker names a container after its image."""
    base = image.rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0]
    return re.sub(r"[^A-Za-z0-9_.-]", "-", base)[:100] or "task"


def _pairs(values: list[str] | None, flag: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for raw in values or []:
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} expects KEY=VALUE, got {raw!r}")
        pairs[key] = value
    return pairs


def _volume(raw: str) -> dict[str, Any]:
    parts = raw.split(":")
    mode = parts.pop() if len(parts) == 3 else "rw"
    if len(parts) != 2 or not all(parts) or mode not in ("ro", "rw"):
        raise UsageError(f"--volume expects HOST:CONTAINER[:ro|rw], got {raw!r}")
    return {"host_path": parts[0], "container_path": parts[1], "read_only": mode == "ro"}


def command_text(words: list[str]) -> str:
    """The API runs `command` with `sh -c`: one word is a shell line, several are quoted."""
    import shlex

    if len(words) == 1:
        return words[0]
    return shlex.join(words)


# argparse dest → API field, for the flags that map one to one
_DIRECT = {
    "gpus": "gpu_required",
    "gpu_type": "gpu_type",
    "gpu_memory_mb": "gpu_memory_mb",
    "gpu_ratio": "gpu_compute_ratio",
    "memory_mb": "memory_mb",
    "cpu": "cpu_cores",
    "priority": "priority",
    "max_retries": "max_retries",
    "retry_delay": "retry_delay",
    "retry_strategy": "retry_strategy",
    "timeout": "timeout",
    "task_type": "task_type",
    "node": "requested_node_id",
}


def task_body(args: argparse.Namespace) -> dict[str, Any]:
    """The `POST /tasks` body from `run`'s flags; unset flags leave the server's defaults."""
    body: dict[str, Any] = {"name": args.name or default_name(args.image), "image": args.image}
    if args.command:
        body["command"] = command_text(args.command)
    for dest, name in _DIRECT.items():
        value = getattr(args, dest)
        if value is not None:
            body[name] = value
    if args.preemptible:
        body["preemptible"] = True
    if args.env:
        body["env"] = [f"{k}={v}" for k, v in _pairs(args.env, "--env").items()]
    if args.label:
        body["labels"] = _pairs(args.label, "--label")
    if args.volume:
        body["volumes"] = [_volume(v) for v in args.volume]
    if args.anti_affinity:
        body["anti_affinity"] = list(args.anti_affinity)
    return body


def cmd_run(ctx: Context, args: argparse.Namespace) -> int:
    params = {"tenant_id": args.tenant} if args.tenant else {}
    if getattr(args, "plan", False):
        return show_plan(ctx, "/tasks", task_body(args), params)
    task = ctx.client.post("/tasks", task_body(args), **params).json()
    if args.detach:
        ctx.print(task["id"] if ctx.output == "table" else out.render(task, ctx.output))
        return EXIT_OK
    ctx.note(f"task {task['id']} ({task['name']}) created")
    try:
        final = wait_for(ctx, task, follow=args.follow)
    except KeyboardInterrupt:
        ctx.note(f"\nstopped waiting; task {task['id']} carries on (heteroflow stop to end it)")
        return 130
    ctx.note(outcome(final))
    return EXIT_OK if final["status"] == "completed" else EXIT_FAILED


def outcome(task: dict[str, Any]) -> str:
    text = f"task {task['id']} {task['status']}"
    if task.get("exit_code") is not None:
        text += f" (exit code {task['exit_code']})"
    error = task.get("error") or ""
    if task["status"] != "completed" and error and error != f"exit code {task.get('exit_code')}":
        text += f": {error}"
    return text


class Progress:
    """The status trail on stderr, `pending → scheduled → running`, as changes are seen."""

    def __init__(self, err: TextIO, task_id: str) -> None:
        self.err, self.task_id = err, task_id
        self.last: str | None = None
        self.open = False
        self.retry = 0

    def show(self, status: str, retry: int = 0, of: Any = None) -> None:
        label = status
        if retry > self.retry:  # the failure itself may come and go between two polls
            self.retry = retry
            label = f"retry {retry}/{of if of is not None else '?'}: {status}"
        elif status == self.last:
            return
        if self.last is None:
            text = f"{self.task_id}: {label}"
        elif self.open:
            text = f" → {label}"
        else:
            text = f"{self.task_id}: {self.last} → {label}"
        self.err.write(text)
        self.err.flush()
        self.open, self.last = True, status

    def break_line(self) -> None:
        if self.open:
            self.err.write("\n")
            self.err.flush()
            self.open = False


def wait_for(ctx: Context, task: dict[str, Any], *, follow: bool) -> dict[str, Any]:
    """Poll until the task is terminal for good (a failure the retry engine retries is not)."""
    progress = Progress(ctx.err, task["id"])
    streamed: set[tuple[str, int]] = set()
    failed_since: float | None = None
    while True:
        # A device requeue (docs/operations.md) is a new attempt at the same retry_count.
        retries = int(task.get("retry_count") or 0)
        attempt = (task.get("node_id") or "", retries + int(task.get("requeues") or 0))
        progress.show(task["status"], retries, task.get("max_retries"))
        if follow and attempt[0] and task["status"] not in UNSTARTED and attempt not in streamed:
            progress.break_line()
            if _stream_attempt(ctx, task):
                streamed.add(attempt)
            else:
                time.sleep(POLL_S)
            task = ctx.client.get(task_path(task["id"]))
            continue
        if task["status"] in TERMINAL:
            if task["status"] != "failed":
                break
            failed_since = failed_since or time.monotonic()
            if _failure_is_final(ctx, task, time.monotonic() - failed_since):
                break
        else:
            failed_since = None
        time.sleep(POLL_S)
        task = ctx.client.get(task_path(task["id"]))
    progress.break_line()
    return task


def _failure_is_final(ctx: Context, task: dict[str, Any], waited_s: float) -> bool:
    # A task that held cards may be requeued for a device fault whatever its retries say.
    no_retries = task.get("max_retries") == 0 or task.get("retry_strategy") == "no_retry"
    if no_retries and not task.get("gpu_ids"):
        return True
    history = ctx.client.get(task_path(task["id"]) + "/retries").get("retries") or []
    decision = str((history[-1] if history else {}).get("decision") or "")
    if decision:
        return not decision.startswith(("retry", "requeue"))
    return waited_s > DECISION_WAIT_S


def _stream_attempt(ctx: Context, task: dict[str, Any]) -> bool:
    """Stream one attempt's logs; False when they are not there yet (try again later)."""
    try:
        follow_logs(ctx, task["id"], ALL_LINES)
    except ApiError as exc:
        if _logs_not_yet(exc, task):
            return False
        ctx.note(f"logs unavailable: {exc}")
    except CliError as exc:  # the stream broke (node lost, ...): keep following the task
        ctx.note(exc.message)
    return True


def _logs_not_yet(exc: ApiError, task: dict[str, Any]) -> bool:
    """No node yet, or a node that has not started the attempt (its logs 404 until then)."""
    if exc.code == NOT_PLACED:
        return True
    return exc.status == 404 and not exc.route_missing and task["status"] not in TERMINAL


# --- logs ---------------------------------------------------------------------------------


def follow_logs(ctx: Context, task_id: str, lines: int) -> int:
    """Print SSE `data` lines as they come; `end` closes the stream, `error` fails it."""
    for event in ctx.client.events(task_path(task_id) + "/logs", follow="true", lines=lines):
        if event.event == "end":
            return EXIT_OK
        if event.event == "error":
            try:
                message = json.loads(event.data).get("error", event.data)
            except ValueError:
                message = event.data
            raise CliError(f"log stream ended: {message}")
        ctx.print(event.data)
    return EXIT_OK


def cmd_logs(ctx: Context, args: argparse.Namespace) -> int:
    lines = args.lines or ALL_LINES
    if not args.follow:
        for line in ctx.client.get(task_path(args.task_id) + "/logs", lines=lines)["logs"]:
            ctx.print(line)
        return EXIT_OK
    noted = False
    while True:
        try:
            return follow_logs(ctx, args.task_id, lines)
        except ApiError as exc:
            task = ctx.client.get(task_path(args.task_id))  # a deleted task ends it here
            if not _logs_not_yet(exc, task):
                raise
        if task["status"] in TERMINAL and not task.get("node_id"):
            raise CliError(f"task {args.task_id} ended {task['status']} before it ran: no logs")
        if not noted:
            ctx.note(f"waiting for task {args.task_id} to be placed (now {task['status']})")
            noted = True
        time.sleep(POLL_S)


# --- ps, describe, retries, stats -----------------------------------------------------------


def list_tasks(
    ctx: Context, *, status: str | None, labels: list[str], show_all: bool
) -> list[dict[str, Any]]:
    """Every matching task, page by page; without -a or --status, only non-terminal ones."""
    params: dict[str, Any] = {"per_page": 500, "sort": "created_at", "order": "desc"}
    if status:
        params["status"] = status
    if labels:
        params["labels"] = ",".join(f"{k}={v}" for k, v in _pairs(labels, "--label").items())
    tasks: list[dict[str, Any]] = []
    page = 1
    while True:
        data = ctx.client.get("/tasks", page=page, **params)
        tasks.extend(data["tasks"])
        if not data["tasks"] or page * params["per_page"] >= int(data.get("total") or 0):
            break
        page += 1
    if status or show_all:
        return tasks
    return [t for t in tasks if t["status"] not in TERMINAL]


def cmd_ps(ctx: Context, args: argparse.Namespace) -> int:
    tasks = list_tasks(ctx, status=args.status, labels=args.label or [], show_all=args.all)
    if ctx.output != "table":
        ctx.print(out.render(tasks, ctx.output))
    elif not tasks:
        ctx.note("No tasks." if args.all or args.status else "No running tasks (-a shows all).")
    else:
        ctx.print(out.ps_table(tasks))
    return EXIT_OK


def cmd_describe(ctx: Context, args: argparse.Namespace) -> int:
    path = task_path(args.task_id)
    as_of = getattr(args, "as_of", None)
    task = ctx.client.get(path, as_of=as_of) if as_of else ctx.client.get(path)
    retries = ctx.client.get(path + "/retries").get("retries") or []
    events = fetch_timeline(ctx.client, path)
    if as_of:  # the server took the time: the attempts and timeline entries up to then
        retries = [r for r in retries if _up_to(r.get("started_at"), as_of)]
        events = [e for e in events or [] if _up_to(e.get("occurred_at"), as_of)]
    if ctx.output == "table":
        ctx.print(out.describe_text(task, retries, events))
    else:
        ctx.print(out.render({"task": task, "retries": retries, "events": events}, ctx.output))
    return EXIT_OK


def _up_to(when: Any, as_of: str) -> bool:
    """Whether a time of the task's history (none: not begun yet) is no later than `as_of`."""
    return not when or datetime.fromisoformat(str(when)) <= datetime.fromisoformat(as_of)


def cmd_retries(ctx: Context, args: argparse.Namespace) -> int:
    data = ctx.client.get(task_path(args.task_id) + "/retries")
    if ctx.output != "table":
        ctx.print(out.render(data, ctx.output))
        return EXIT_OK
    ctx.print(f"Task {data.get('task_id', args.task_id)}: {data.get('total_retries', 0)} retries")
    ctx.print(out.retries_table(data.get("retries") or []))
    return EXIT_OK


def cmd_stats(ctx: Context, args: argparse.Namespace) -> int:
    data = ctx.client.get("/tasks/stats")
    if ctx.output != "table":
        ctx.print(out.render(data, ctx.output))
        return EXIT_OK
    counts = {s: n for s, n in (data.get("by_status") or {}).items() if n}
    order = [s for s in STATUS_ORDER if s in counts] + sorted(set(counts) - set(STATUS_ORDER))
    rows = [(s, counts[s]) for s in order] + [("total", data.get("total", sum(counts.values())))]
    ctx.print(out.table(("STATUS", "COUNT"), rows))
    return EXIT_OK


# --- stop, sleep, wake, rm --------------------------------------------------------------------

WAKE_202 = {
    "queued": "queued: the card is lent to a training task; the scheduler finishes the wake",
    "rescheduling": "rescheduling: the host is offline, the task goes back to pending",
}


def operate(ctx: Context, base: str, ids: list[str], op: str) -> int:
    """POST `{base}/{id}/{op}` (DELETE for rm) on each id; the worst exit code wins."""
    worst = EXIT_OK
    for item in ids:
        path = f"{base}/{quote(item, safe='')}"
        try:
            if op == "rm":
                status, data = 200, ctx.client.delete(path)
            else:
                response = ctx.client.post(f"{path}/{op}")
                status, data = response.status_code, response.json()
        except CliError as exc:
            ctx.note(f"error: {item}: {exc}" if len(ids) > 1 else f"error: {exc}")
            worst = max(worst, exc.exit_code)
            continue
        if ctx.output != "table":
            ctx.print(out.render(data, ctx.output))
        elif op == "rm":
            ctx.print(f"{item}: deleted" + (f" ({data['status']})" if data.get("status") else ""))
        elif "changed" in data:  # a group: what happened to each member
            ctx.print(f"{item}: {op} {members(data)}")
        elif status == 202:
            state = str(data.get("status", "accepted"))
            ctx.print(f"{item}: {WAKE_202.get(state, state)}")
        else:
            ctx.print(f"{item}: {data.get('status', 'ok')}")
    return worst


def members(data: dict[str, Any]) -> str:
    changed, skipped = data.get("changed") or [], data.get("skipped") or {}
    text = f"changed {len(changed)} task(s)"
    if skipped:
        text += f", skipped {len(skipped)}: " + "; ".join(f"{k}: {v}" for k, v in skipped.items())
    return text


def cmd_operate(ctx: Context, args: argparse.Namespace) -> int:
    return operate(ctx, "/tasks", args.task_ids, args.op)
