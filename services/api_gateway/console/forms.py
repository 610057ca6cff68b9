"""The console's create forms (task, group, job, rollout) as the API's JSON bodies (pure).

Numbers are sent as numbers when they read as numbers and as the text typed otherwise, so a
wrong value is refused by the API itself, which names the field; empty fields are left out
(the API's defaults apply). Only the environment's shape is checked here: one NAME=value per
line.
"""

from __future__ import annotations

import json
import re
from typing import Any

TEXT = ("name", "image", "command", "gpu_type", "task_type", "queue")
INTEGERS = ("gpu_required", "gpu_memory_mb", "memory_mb", "priority", "timeout", "max_retries")
NUMBERS = ("cpu_cores", "gpu_compute_ratio")
FIELDS = TEXT + INTEGERS + NUMBERS + ("env",)
GROUP_TEXT = ("parallelism",)
GROUP_INTEGERS = ("task_count", "per_node_gpu", "tensor_parallel_size", "pipeline_parallel_size")
GROUP_FIELDS = FIELDS + GROUP_TEXT + GROUP_INTEGERS
JOB_FIELDS = ("name", "queue", "tasks", "dependencies")
ROLLOUT_INTEGERS = ("partition", "max_surge", "max_unavailable", "health_timeout_s")
ROLLOUT_FIELDS = ("image", "strategy") + ROLLOUT_INTEGERS
# A dependency line: `TASK KIND ON [artifact or condition]`, as the API's objects.
KINDS = ("after", "data", "resource", "condition")


def task_body(
    form: dict[str, str],
    text: tuple[str, ...] = TEXT,
    integers: tuple[str, ...] = INTEGERS,
    known: tuple[str, ...] = FIELDS,
) -> tuple[dict[str, Any], dict[str, str]]:
    """(the body, problems by field name); problems are only those found before the API."""
    body: dict[str, Any] = {}
    problems: dict[str, str] = {}
    for name in text:
        if value := form.get(name, "").strip():
            body[name] = value
    for name in integers + NUMBERS:
        raw = form.get(name, "").strip()
        if raw:
            body[name] = _number(raw, integer=name in integers)
    env: dict[str, str] = {}
    for n, line in enumerate(form.get("env", "").splitlines(), 1):
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            problems["env"] = f"line {n}: each line is NAME=value"
            break
        env[key.strip()] = value
    if env:
        body["env"] = env
    _unknown(form, known, problems)
    return body, problems


def group_body(form: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """A group: the member template's fields plus its shape."""
    return task_body(form, TEXT + GROUP_TEXT, INTEGERS + GROUP_INTEGERS, GROUP_FIELDS)


def job_body(form: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """A job: `tasks` as the API's JSON list, `dependencies` one per line
    (`train after prep`, `train data prep /work/out`, `export condition train accuracy > 0.9`)."""
    body: dict[str, Any] = {}
    problems: dict[str, str] = {}
    for name in ("name", "queue"):
        if value := form.get(name, "").strip():
            body[name] = value
    raw = form.get("tasks", "").strip()
    try:
        body["tasks"] = json.loads(raw) if raw else []
    except json.JSONDecodeError as exc:
        problems["tasks"] = f"tasks: not JSON ({exc.msg} at line {exc.lineno})"
    deps = []
    for n, line in enumerate(form.get("dependencies", "").splitlines(), 1):
        words = line.split(None, 3)
        if not words:
            continue
        if len(words) < 3 or words[1] not in KINDS:
            problems["dependencies"] = (
                f"dependencies line {n}: TASK KIND ON [artifact or condition], "
                f"KIND one of {', '.join(KINDS)}"
            )
            break
        dep = {"task": words[0], "kind": words[1], "on": words[2]}
        extra = words[3] if len(words) > 3 else ""
        if extra:
            dep["artifact" if words[1] == "data" else "condition"] = extra
        deps.append(dep)
    body["dependencies"] = deps
    _unknown(form, JOB_FIELDS, problems)
    return body, problems


def rollout_body(form: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """A rollout's start (image and pace) or, with `partition` alone, its canary's move."""
    return task_body(form, ("image", "strategy"), ROLLOUT_INTEGERS, ROLLOUT_FIELDS)


def field_problems(problem: dict[str, Any], fallback: str) -> dict[str, str]:
    """The API's refusal by form field: `tasks[2].gpus` and `schedule_window.start` are
    shown beside `tasks` and `schedule_window`; without fields, above the form."""
    message = str(problem.get("error", "")) or fallback
    found = {re.split(r"[.\[]", str(f))[0]: message for f in problem.get("fields", [])}
    return found or {"": message}


def _unknown(form: dict[str, str], known: tuple[str, ...], problems: dict[str, str]) -> None:
    unknown = sorted(set(form) - set(known))
    if unknown:
        problems[""] = f"unknown form field(s): {', '.join(unknown)}"


def _number(raw: str, *, integer: bool) -> int | float | str:
    try:
        return int(raw) if integer else float(raw)
    except ValueError:
        return raw  # the API refuses it and names the field
