"""The console's task form as the API's JSON body (pure).

Numbers are sent as numbers when they read as numbers and as the text typed otherwise, so a
wrong value is refused by the API itself, which names the field; empty fields are left out
(the API's defaults apply). Only the environment's shape is checked here: one NAME=value per
line.
"""

from __future__ import annotations

from typing import Any

TEXT = ("name", "image", "command", "gpu_type", "task_type", "queue")
INTEGERS = ("gpu_required", "gpu_memory_mb", "memory_mb", "priority", "timeout", "max_retries")
NUMBERS = ("cpu_cores", "gpu_compute_ratio")
FIELDS = TEXT + INTEGERS + NUMBERS + ("env",)


def task_body(form: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """(the body, problems by field name); problems are only those found before the API."""
    body: dict[str, Any] = {}
    problems: dict[str, str] = {}
    for name in TEXT:
        if value := form.get(name, "").strip():
            body[name] = value
    for name in INTEGERS + NUMBERS:
        raw = form.get(name, "").strip()
        if raw:
            body[name] = _number(raw, integer=name in INTEGERS)
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
    unknown = sorted(set(form) - set(FIELDS))
    if unknown:
        problems[""] = f"unknown form field(s): {', '.join(unknown)}"
    return body, problems


def _number(raw: str, *, integer: bool) -> int | float | str:
    try:
        return int(raw) if integer else float(raw)
    except ValueError:
        return raw  # the API refuses it and names the field
