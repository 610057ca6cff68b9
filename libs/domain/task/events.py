"""Task events: versioned, frozen payloads of stream `task-<id>`."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Literal

from pydantic import model_validator

from libs.domain.payload import Payload, ReasonedPayload, register
from libs.domain.task.model import TaskId, TaskSpec, TenantId, upcast_task_doc
from libs.domain.task.states import TaskStatus

# --- tasks -----------------------------------------------------------------------------


class TaskCreated(Payload):
    """A task was submitted (or created as a group member) with its validated spec."""

    type: ClassVar[str] = "task_created"
    stream_type: ClassVar[str] = "task"

    task_id: TaskId
    tenant_id: TenantId
    spec: TaskSpec
    group_id: str | None = None
    rank: int | None = None
    generation: int = 0

    @model_validator(mode="before")
    @classmethod
    def _upcast(cls, data: Any) -> Any:
        # Stored before `Platform`: the platform's labels move into the spec's `platform`.
        return upcast_task_doc(data)


class TaskStatusChanged(ReasonedPayload):
    """One accepted transition with whatever the transition carries (placement, result, ...).

    `None` means "unchanged"; the fold applies only the fields that are set.
    """

    type: ClassVar[str] = "task_status_changed"
    stream_type: ClassVar[str] = "task"

    task_id: TaskId
    from_status: TaskStatus
    to_status: TaskStatus
    actor: str
    node_id: str | None = None
    gpu_ids: tuple[str, ...] | None = None
    qos: str | None = None
    container_id: str | None = None
    serve_address: str | None = None
    gpu_label: str | None = None  # "vendor/model" of the placement's cards
    engine: str | None = None  # the engine profile the agent applied
    ports: dict[str, int] | None = None  # host ports allocated with the placement
    variant: int | None = None  # the index in spec.variants the placement runs
    # The placement's named scores (services/scheduler/placement/rankers.py): why this node.
    # Not folded into the task row; empty for every other transition.
    scores: dict[str, float] = {}
    exit_code: int | None = None
    result: str | None = None
    error: str | None = None
    retry_count: int | None = None
    requeues: int | None = None  # device requeues (uncharged), docs/operations.md
    memory_mb: int | None = None
    clear_placement: bool = False
    # Failure evidence for the retry engine's classifier (not folded into the task row).
    error_kind: str | None = None
    oom_killed: bool | None = None
    # Device evidence the agent read for a failed attempt (kernel log lines, NVML XIDs):
    # the retry engine's device classifier (libs/domain/task/device_fault.py).
    device_log: str | None = None
    xids: tuple[int, ...] | None = None
    # Constraints for the next attempt (a requeue to pending sets them; None clears them).
    not_before: datetime | None = None
    same_node_id: str | None = None
    avoid_node_ids: tuple[str, ...] | None = None
    min_vram_mb: int | None = None


class TaskRetryDecided(Payload):
    """The retry engine's decision on one failure, with its reason (retried or not)."""

    type: ClassVar[str] = "task_retry_decided"
    stream_type: ClassVar[str] = "task"

    task_id: TaskId
    attempt: int
    node_id: str | None
    failure_class: str
    failure_kind: str
    action: Literal["retry", "give_up", "hold", "requeue"]  # requeue: a device fault
    # The device verdict on the failure (libs/domain/task/device_fault.py), "" when none.
    device_verdict: str = ""
    device_evidence: str = ""
    reason: str
    delay_s: float = 0.0
    memory_mb: int | None = None


class TaskConfigUpdated(Payload):
    """Configuration fields changed (pending only, or idle_timeout_minutes)."""

    type: ClassVar[str] = "task_config_updated"
    stream_type: ClassVar[str] = "task"

    task_id: TaskId
    changes: dict[str, Any]


class TaskPendingReason(ReasonedPayload):
    """Why the scheduler left a pending task where it is (shown by GET /tasks/{id})."""

    type: ClassVar[str] = "task_pending_reason"
    stream_type: ClassVar[str] = "task"

    task_id: TaskId


class TaskDrainMarked(ReasonedPayload):
    """A rollout (an old-generation replica) or a scale-down (a replica it removes) marked a
    replica to drain: the router sends it nothing new."""

    type: ClassVar[str] = "task_drain_marked"
    stream_type: ClassVar[str] = "task"

    task_id: TaskId


class TaskRankMoved(ReasonedPayload):
    """A scale-down of a `split` group gave a kept replica the rank of one it removes (and
    that one the kept one's), so the members it keeps are still ranks `0..size-1`."""

    type: ClassVar[str] = "task_rank_moved"
    stream_type: ClassVar[str] = "task"

    task_id: TaskId
    from_rank: int
    to_rank: int


class TaskDeleted(Payload):
    """Logically deleted: gone from queries; the stream stays."""

    type: ClassVar[str] = "task_deleted"
    stream_type: ClassVar[str] = "task"

    task_id: TaskId


register(
    TaskCreated,
    TaskStatusChanged,
    TaskRetryDecided,
    TaskConfigUpdated,
    TaskPendingReason,
    TaskDrainMarked,
    TaskRankMoved,
    TaskDeleted,
)
