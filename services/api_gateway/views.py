"""JSON shapes of API responses."""

from __future__ import annotations

from typing import Any

from libs.domain.task.model import RetryVerdict, Task


def task_view(task: Task) -> dict[str, Any]:
    spec = task.spec.model_dump(mode="json")
    spec["gpu_count"] = spec["gpu_required"]  # V2 clients read this name
    state = task.model_dump(mode="json", exclude={"spec", "deleted_at"})
    # V2 clients read `node_name`; a node is named by its id (the agent's
    # HETEROFLOW_NODE_ID, by default its host name).
    state["node_name"] = task.node_id
    return spec | state


def task_responses() -> dict[int | str, dict[str, Any]]:
    """The documented 200 of a task read: the task view is open-ended (every spec and state
    field), and names the fields a client branches on, `retry` among them."""
    verdict = RetryVerdict.model_json_schema()
    verdict["description"] = (
        "the retry engine's last decision on a failure: `give_up` means failed for good "
        "(a permanent failure, retries used up, or no_retry), with why; null if it never failed"
    )
    schema = {
        "type": "object",
        "additionalProperties": True,
        "properties": {
            "id": {"type": "string"},
            "status": {"$ref": "#/components/schemas/TaskStatus"},
            "retry": {"anyOf": [verdict, {"type": "null"}]},
        },
    }
    return {200: {"content": {"application/json": {"schema": schema}}}}


def operation_view(task: Task, message: str) -> dict[str, Any]:
    """The answer of stop, sleep, wake and delete: the task view and, as V2 had it, a message."""
    return task_view(task) | {"message": message}
