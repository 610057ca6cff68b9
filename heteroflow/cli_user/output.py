"""Rendering for the user commands: aligned tables, JSON, YAML, ages, resource cells and the
task views (ps, describe, attempts, timeline).

Pure functions over plain JSON values (what the API returns); nothing here does I/O, so
every shape a command prints is testable without a server.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

FORMATS = ("table", "json", "yaml")
EMPTY = "-"
GAP = "   "

# YAML 1.1 words a loader would not read back as strings (PyYAML resolves all of them).
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~", ""}
_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./+=()@ -]*$")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Columns padded to their widest cell, three spaces apart, no trailing blanks."""
    body = [[cell(value) for value in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in body:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
    lines = [headers, *body]
    return "\n".join(
        GAP.join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def cell(value: Any) -> str:
    if value is None or value == "" or value == [] or value == {}:
        return EMPTY
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list | tuple):
        return ",".join(cell(v) for v in value)
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def fields(pairs: Iterable[tuple[str, Any]], indent: int = 0) -> str:
    """`Key:   value` lines, values aligned (the head of `describe`)."""
    items = [(f"{key}:", cell(value)) for key, value in pairs]
    width = max((len(k) for k, _ in items), default=0)
    pad = " " * indent
    return "\n".join(f"{pad}{k.ljust(width)}  {v}".rstrip() for k, v in items)


def to_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def to_yaml(value: Any) -> str:
    """PyYAML when it is installed, the built-in emitter otherwise (same data either way)."""
    try:
        import yaml
    except ImportError:
        return dump_yaml(value)
    text: str = yaml.safe_dump(value, sort_keys=False, allow_unicode=True, default_flow_style=False)
    return text


def render(value: Any, fmt: str) -> str:
    """JSON or YAML of `value`; tables are built by each command."""
    if fmt == "json":
        return to_json(value)
    if fmt == "yaml":
        return to_yaml(value).rstrip("\n")
    raise ValueError(f"not a data format: {fmt}")


# --- a small YAML emitter: block style for mappings and sequences, safe scalars -------------


def dump_yaml(value: Any) -> str:
    return "\n".join(_yaml_lines(value, 0)) + "\n"


def _is_block(value: Any) -> bool:
    return isinstance(value, dict | list | tuple) and len(value) > 0


def _yaml_lines(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    if isinstance(value, dict) and value:
        out: list[str] = []
        for key, item in value.items():
            name = yaml_scalar(str(key))
            if _is_block(item):
                out.append(f"{pad}{name}:")
                out.extend(_yaml_lines(item, indent + 2))
            else:
                out.append(f"{pad}{name}: {yaml_scalar(item)}")
        return out
    if isinstance(value, list | tuple) and value:
        out = []
        for item in value:
            if _is_block(item):
                inner = _yaml_lines(item, indent + 2)
                out.append(f"{pad}- {inner[0][indent + 2 :]}")
                out.extend(inner[1:])
            else:
                out.append(f"{pad}- {yaml_scalar(item)}")
        return out
    return [pad + yaml_scalar(value)]


def yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        return repr(value)
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list | tuple):
        return "[]"
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in _YAML_WORDS and not text.endswith(" "):
        return text
    # A JSON string is a valid YAML double-quoted scalar, escapes included.
    return json.dumps(text, ensure_ascii=False)


# --- cells ------------------------------------------------------------------------------------


def parse_time(value: Any) -> datetime | None:
    if not value or not isinstance(value, str):
        return None
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def age(value: Any, now: datetime | None = None) -> str:
    """kubectl-style age: 42s, 5m, 3h, 2d."""
    at = parse_time(value)
    if at is None:
        return EMPTY
    seconds = max(0, int(((now or datetime.now(UTC)) - at).total_seconds()))
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size * (2 if unit != "d" else 1):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def short_time(value: Any) -> str:
    at = parse_time(value)
    return at.strftime("%Y-%m-%d %H:%M:%S") if at else EMPTY


def task_gpus(task: dict[str, Any]) -> str:
    """Whole cards (`2`, `2:A100`) or a fraction (`8192MiB`, `0.5`); a task with variants
    shows its placed variant's (`1:huawei/Ascend910B [variant 1]`), else how many it has."""
    variants = task.get("variants") or []
    if variants:
        placed = task.get("variant")
        if isinstance(placed, int) and 0 <= placed < len(variants):
            return f"{task_gpus(dict(variants[placed]))} [variant {placed}]"
        return f"{len(variants)} variants"
    kind = task.get("gpu_type") or ""
    count = task.get("gpu_required") or task.get("gpu_count") or 0
    if count:
        amount = str(count)
    elif task.get("gpu_memory_mb"):
        amount = f"{task['gpu_memory_mb']}MiB"
    elif task.get("gpu_compute_ratio"):
        amount = f"{task['gpu_compute_ratio']:g}"
    else:
        return "0"
    return f"{amount}:{kind}" if kind else amount


def node_gpus(node: dict[str, Any]) -> str:
    """Cards grouped by vendor and model: `nvidia:A100x4,amd:MI300x2`."""
    counts: dict[str, int] = {}
    for card in (node.get("inventory") or {}).get("gpus") or []:
        key = f"{card.get('vendor', '?')}:{card.get('model', '?')}"
        counts[key] = counts.get(key, 0) + 1
    return ",".join(f"{key}x{n}" for key, n in counts.items()) or "0"


def node_runtime(node: dict[str, Any]) -> str:
    """The node's runtime and how it confines work: `docker+userns`, `process+cgroup-v1`,
    `process+no-cgroups`, `docker+no-isolation` (tenants' containers can reach each other)."""
    inventory = node.get("inventory") or {}
    runtime = str(inventory.get("runtime") or EMPTY)
    if runtime == "docker" and inventory.get("isolation") == "none":
        runtime += "+no-isolation"
    if inventory.get("userns_remap"):
        return f"{runtime}+userns"
    cgroups = inventory.get("cgroups")
    if cgroups == "none":
        return f"{runtime}+no-cgroups"
    return f"{runtime}+cgroup-{cgroups}" if cgroups else runtime


def mebibytes(value: Any) -> str:
    if not isinstance(value, int | float) or value <= 0:
        return EMPTY
    if value >= 1024:
        return f"{value / 1024:.1f}".removesuffix(".0") + "GiB"
    return f"{int(value)}MiB"


# --- views of tasks, attempts and timeline events ----------------------------------------

PS_HEADERS = ("ID", "NAME", "STATUS", "NODE", "GPUS", "PRIORITY", "AGE")
TIME_KEYS = ("occurred_at", "at", "time", "timestamp", "created_at")
KIND_KEYS = ("kind", "type", "event_type", "event")
TEXT_KEYS = ("message", "reason", "detail", "description", "summary")
SKIP_KEYS = {
    *("id", "task_id", "group_id", "tenant_id", "subject_type", "subject_id", "details"),
    *TIME_KEYS,
    *KIND_KEYS,
    *TEXT_KEYS,
}


def ps_table(tasks: list[dict[str, Any]]) -> str:
    rows = [
        (
            t["id"],
            t.get("name"),
            t.get("status"),
            t.get("node_id"),
            task_gpus(t),
            t.get("priority"),
            age(t.get("created_at")),
        )
        for t in tasks
    ]
    return table(PS_HEADERS, rows)


def _first(item: dict[str, Any], keys: tuple[str, ...]) -> Any:
    return next((item[k] for k in keys if item.get(k) not in (None, "")), None)


def event_time(item: dict[str, Any]) -> Any:
    return _first(item, TIME_KEYS)


def _scalars(item: dict[str, Any], skip: set[str]) -> str:
    return " ".join(
        f"{k}={v}"
        for k, v in item.items()
        if k not in skip and v not in (None, "") and not isinstance(v, dict | list)
    )


def _detail(item: dict[str, Any]) -> str:
    """The message, then the other scalar fields and `details` as k=v."""
    details = item.get("details") if isinstance(item.get("details"), dict) else {}
    parts = (_first(item, TEXT_KEYS), _scalars(item, SKIP_KEYS), _scalars(details or {}, set()))
    return " ".join(str(x) for x in parts if x) or EMPTY


def timeline_table(events: list[dict[str, Any]]) -> str:
    rows = [(short_time(event_time(e)), _first(e, KIND_KEYS), _detail(e)) for e in events]
    return table(("TIME", "KIND", "DETAIL"), rows)


VERDICTS = {"give_up": "given up (failed for good)", "retry": "retried", "hold": "held"}


def verdict_text(retry: dict[str, Any]) -> str:
    """The retry engine's last verdict on a failure, with its reason."""
    verdict = VERDICTS.get(retry.get("verdict", ""), retry.get("verdict"))
    return f"{verdict}, {retry.get('failure_class', '?')}: {retry.get('reason', '')}"


def describe_text(
    task: dict[str, Any],
    retries: list[dict[str, Any]] | None,
    events: list[dict[str, Any]] | None,
) -> str:
    volumes = [
        f"{v['host_path']}:{v['container_path']}" + (":ro" if v.get("read_only") else "")
        for v in task.get("volumes") or []
    ]
    pairs: list[tuple[str, Any]] = [
        ("Name", task.get("name")),
        ("ID", task["id"]),
        ("Status", task.get("status")),
    ]
    if task.get("status") == "pending":
        pairs.append(("Pending reason", task.get("pending_reason") or "waiting for the scheduler"))
    pairs += [
        ("Image", task.get("image")),
        ("Command", task.get("command")),
        ("Type", task.get("task_type")),
        ("Node", task.get("node_id")),
        ("GPUs", task_gpus(task)),
        ("GPU ids", task.get("gpu_ids")),
        ("Memory", mebibytes(task.get("memory_mb"))),
        ("CPU", task.get("cpu_cores")),
        ("Priority", task.get("priority")),
        ("Preemptible", task.get("preemptible")),
        (
            "Retries",
            f"{task.get('retry_count', 0)} of {task.get('max_retries', '?')}"
            f" ({task.get('retry_strategy', '-')})",
        ),
        *([("Retry verdict", verdict_text(task["retry"]))] if task.get("retry") else []),
        ("Exit code", task.get("exit_code")),
        ("Error", task.get("error")),
        ("Labels", task.get("labels")),
        ("Env", task.get("env")),
        ("Volumes", volumes),
        ("Created", when(task.get("created_at"))),
        ("Started", when(task.get("started_at"))),
        ("Finished", when(task.get("finished_at"))),
    ]
    pairs += _loan(task)
    parts = [fields(pairs), "", "Attempts:"]
    parts.append(_indent(retries_table(retries)) if retries else "  none")
    parts += ["", "Events:"]
    if events is None:
        parts.append("  (this server has no timeline endpoint)")
    else:
        parts.append(_indent(timeline_table(events)) if events else "  none")
    return "\n".join(parts)


def _loan(task: dict[str, Any]) -> list[tuple[str, Any]]:
    """Card lending lines, only while a loan concerns the task (docs/serving.md)."""
    out: list[tuple[str, Any]] = []
    if task.get("lent_to"):
        queued = " (wake queued until it ends)" if task.get("wake_queued") else ""
        out.append(("Card lent to", f"{task['lent_to']}{queued}"))
    if task.get("borrowed_from"):
        out.append(("Card borrowed from", task["borrowed_from"]))
    return out


def when(value: Any) -> str:
    at = short_time(value)
    return at if at == EMPTY else f"{at} ({age(value)} ago)"


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def retries_table(attempts: list[dict[str, Any]]) -> str:
    headers = ("ATTEMPT", "NODE", "STATUS", "EXIT", "MEMORY", "STARTED", "FINISHED", "ERROR")
    rows = [
        (
            a.get("attempt"),
            a.get("node_id"),
            a.get("status"),
            a.get("exit_code"),
            mebibytes(a.get("memory_mb")),
            short_time(a.get("started_at")),
            short_time(a.get("finished_at")),
            " | ".join(x for x in (a.get("error"), a.get("decision")) if x),
        )
        for a in attempts
    ]
    return table(headers, rows)
