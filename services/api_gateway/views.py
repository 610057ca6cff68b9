"""JSON shapes of API responses."""

from __future__ import annotations

from typing import Any

from libs.domain.task.model import Task


def task_view(task: Task) -> dict[str, Any]:
    spec = task.spec.model_dump(mode="json")
    spec["gpu_count"] = spec["gpu_required"]  # V2 clients read this name
    state = task.model_dump(mode="json", exclude={"spec", "deleted_at"})
    # V2 clients read `node_name`; a node is named by its id (the agent's
    # HETEROFLOW_NODE_ID, by default its host name).
    state["node_name"] = task.node_id
    return spec | state


def operation_view(task: Task, message: str) -> dict[str, Any]:
    """The answer of stop, sleep, wake and delete: the task view and, as V2 had it, a message."""
    return task_view(task) | {"message": message}
