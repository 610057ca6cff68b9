"""JSON shapes of API responses."""

from __future__ import annotations

from typing import Any

from libs.domain.task import Task


def task_view(task: Task) -> dict[str, Any]:
    spec = task.spec.model_dump(mode="json")
    spec["gpu_count"] = spec["gpu_required"]  # V2 clients read this name
    state = task.model_dump(mode="json", exclude={"spec", "deleted_at"})
    return spec | state
