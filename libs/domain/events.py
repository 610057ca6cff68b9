"""Domain events: versioned, frozen payloads, and the folds that turn them into state.

Every accepted change is one of these events appended to a stream (`task-<id>`,
`tenant-<id>`, `system`). Projections are `evolve` applied in order, so replaying the store
rebuilds identical read models. Payload models carry `schema_version`; a consumer that meets
a newer version than it knows must not guess (see docs/events.md).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from .reasons import REASON_SCHEMA_VERSION, ReasonCode, upcast_reason
from .states import TaskStatus
from .task import Task, TaskId, TaskSpec, TenantId, upcast_task_doc


class Payload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    type: ClassVar[str]
    stream_type: ClassVar[str]
    schema_version: int = 1


class ReasonedPayload(Payload):
    """A payload that says why: a code for programs, free text for people.

    Version 2 added `reason_code`. A stored version-1 payload (text only) is upcast when it
    is loaded: the code is derived from its text once, by `reasons.legacy_reason_code`.
    """

    schema_version: int = REASON_SCHEMA_VERSION
    reason_code: ReasonCode
    reason: str = ""

    @model_validator(mode="before")
    @classmethod
    def _upcast(cls, data: Any) -> Any:
        return upcast_reason(cls.type, data)


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
    # The placement's named scores (services/scheduler/placement/rankers.py): why this node.
    # Not folded into the task row; empty for every other transition.
    scores: dict[str, float] = {}
    exit_code: int | None = None
    result: str | None = None
    error: str | None = None
    retry_count: int | None = None
    memory_mb: int | None = None
    clear_placement: bool = False
    # Failure evidence for the retry engine's classifier (not folded into the task row).
    error_kind: str | None = None
    oom_killed: bool | None = None
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
    action: Literal["retry", "give_up", "hold"]
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
    """A rollout marked an old-generation replica to drain: the router sends it nothing new."""

    type: ClassVar[str] = "task_drain_marked"
    stream_type: ClassVar[str] = "task"

    task_id: TaskId


class TaskDeleted(Payload):
    """Logically deleted: gone from queries; the stream stays."""

    type: ClassVar[str] = "task_deleted"
    stream_type: ClassVar[str] = "task"

    task_id: TaskId


# --- tenants and credentials -------------------------------------------------------------


class TenantCreated(Payload):
    """A tenant, with its GPU quota (0 = unlimited)."""

    type: ClassVar[str] = "tenant_created"
    stream_type: ClassVar[str] = "tenant"

    tenant_id: TenantId
    name: str
    gpu_quota: int = 0  # 0 = unlimited


class TenantUpdated(Payload):
    """An operator changed a tenant: `suspended` stops new work and scale-ups; `gpu_quota`
    (0 = unlimited). A field left None is unchanged."""

    type: ClassVar[str] = "tenant_updated"
    stream_type: ClassVar[str] = "tenant"

    tenant_id: TenantId
    suspended: bool | None = None
    gpu_quota: int | None = None


class ApiKeyIssued(Payload):
    """A tenant API key; only its SHA-256 hash and prefix are recorded."""

    type: ClassVar[str] = "api_key_issued"
    stream_type: ClassVar[str] = "tenant"

    key_id: str
    tenant_id: TenantId
    name: str
    prefix: str
    key_hash: str


class ApiKeyRevoked(Payload):
    """A tenant API key stops working."""

    type: ClassVar[str] = "api_key_revoked"
    stream_type: ClassVar[str] = "tenant"

    key_id: str
    tenant_id: TenantId


class SystemCredentialIssued(Payload):
    """An operator token or an agent key (stored as a hash, like tenant keys).

    An agent key issued for a node carries `node_id` (it acts for that node only, and a newer
    key for the same node revokes it) and `nats_password_hash`, the bcrypt hash of the same
    key, which the embedded NATS server checks when the agent logs in as `agent-<node_id>`.
    Older agent keys have neither and can do nothing in the API.
    """

    type: ClassVar[str] = "system_credential_issued"
    stream_type: ClassVar[str] = "system"

    credential_id: str
    role: Literal["operator", "agent"]
    name: str
    prefix: str
    key_hash: str
    node_id: str | None = None
    nats_password_hash: str | None = None


class JoinTokenIssued(Payload):
    """A one-time token with which one new node may register itself (stored as a hash)."""

    type: ClassVar[str] = "join_token_issued"
    stream_type: ClassVar[str] = "join"

    token_id: str
    prefix: str
    key_hash: str
    expires_at: datetime


class NodeJoined(Payload):
    """A join token was spent by `node_id`; that node's key is issued in the same append."""

    type: ClassVar[str] = "node_joined"
    stream_type: ClassVar[str] = "join"

    token_id: str
    node_id: str


PAYLOAD_TYPES: dict[str, type[Payload]] = {}


def register(*classes: type[Payload]) -> None:
    """Add payload types to the catalogue (each domain module registers its own)."""
    for cls in classes:
        if PAYLOAD_TYPES.setdefault(cls.type, cls) is not cls:
            raise ValueError(f"event type {cls.type} registered twice")


register(
    TaskCreated,
    TaskStatusChanged,
    TaskRetryDecided,
    TaskConfigUpdated,
    TaskPendingReason,
    TaskDrainMarked,
    TaskDeleted,
    TenantCreated,
    TenantUpdated,
    ApiKeyIssued,
    ApiKeyRevoked,
    SystemCredentialIssued,
    JoinTokenIssued,
    NodeJoined,
)


def parse_payload(event_type: str, data: dict[str, Any]) -> Payload:
    """Parse a stored payload; import `libs.domain.catalog` so every module has registered."""
    return PAYLOAD_TYPES[event_type].model_validate(data)


# --- folds -------------------------------------------------------------------------------


# What a status change clears when it takes a task off its node, and the fields it carries
# onto the task when set (shared with replay's document fold, libs/store/replay_fold.py).
CLEARED_PLACEMENT: dict[str, Any] = {
    "node_id": None,
    "gpu_ids": (),
    "qos": "",
    "container_id": "",
    "serve_address": "",
    "gpu_label": "",
    "ports": {},
}
CARRIED_FIELDS = (*CLEARED_PLACEMENT, "engine", "exit_code", "result", "error")


# Task events defined in other domain modules (lending.py) and what each changes on the task.
TASK_FOLDS: dict[type[Payload], Callable[[Task, Any], dict[str, Any]]] = {}

# Lending state that only lasts while a task sleeps (libs/domain/lending.py): any status
# change out of `sleeping` ends it; a requeue also ends a borrower's loan.
SLEEP_ONLY: dict[str, Any] = {"sleep_released": False, "lent_to": "", "wake_queued": False}


def evolve_task(task: Task | None, event: Payload, at: datetime, version: int) -> Task:
    """The task after `event` (appended at `at` as `version` of its stream).

    Replay applies the same rules to plain documents (libs/store/replay_fold.py); a change
    here needs its twin there, and tests/unit/test_replay_fold.py fails until it has one.
    """
    if isinstance(event, TaskCreated):
        return Task(
            id=event.task_id,
            tenant_id=event.tenant_id,
            spec=event.spec,
            group_id=event.group_id,
            rank=event.rank,
            generation=event.generation,
            status_reason_code=ReasonCode.SUBMITTED,
            version=version,
            created_at=at,
            updated_at=at,
        )
    if task is None:
        raise ValueError(f"{event.type} before task_created")
    changes: dict[str, Any] = {"version": version, "updated_at": at}
    if isinstance(event, TaskStatusChanged):
        changes.update(_status_changes(task, event, at))
    elif isinstance(event, TaskConfigUpdated):
        changes["spec"] = task.spec.model_copy(update=_spec_update(event.changes))
    elif isinstance(event, TaskPendingReason):
        changes.update(pending_reason=event.reason, pending_reason_code=event.reason_code)
    elif isinstance(event, TaskDrainMarked):
        changes["draining"] = True
    elif isinstance(event, TaskDeleted):
        changes["deleted_at"] = at
    elif isinstance(event, TaskRetryDecided):
        pass  # history only: the status change that follows carries the new state
    elif (fold := TASK_FOLDS.get(type(event))) is not None:
        changes.update(fold(task, event))
    else:
        raise ValueError(f"not a task event: {event.type}")
    return task.model_copy(update=changes)


def _spec_update(changes: dict[str, Any]) -> dict[str, Any]:
    # Re-validate through the model so nested values (volumes) get their types back.
    return {
        k: getattr(TaskSpec.model_validate({"name": "x", "image": "x", k: v}), k)
        for k, v in changes.items()
    }


def _status_changes(task: Task, ev: TaskStatusChanged, at: datetime) -> dict[str, Any]:
    # Any status change ends the previous wait: the scheduler says again why, if need be.
    out: dict[str, Any] = {
        "status": ev.to_status,
        "status_reason_code": ev.reason_code,
        "status_reason": ev.reason,
        "pending_reason": "",
        "pending_reason_code": None,
    }
    if ev.clear_placement:
        out.update(CLEARED_PLACEMENT)
    for name in CARRIED_FIELDS:
        value = getattr(ev, name)
        if value is not None:
            out[name] = value
    if ev.to_status is not TaskStatus.SLEEPING:
        out.update(SLEEP_ONLY)
    if ev.retry_count is not None:
        out["retry_count"] = ev.retry_count
    if ev.memory_mb is not None:
        out["spec"] = task.spec.model_copy(update={"memory_mb": ev.memory_mb})
    if ev.to_status is TaskStatus.RUNNING and task.started_at is None:
        out["started_at"] = at
    if ev.to_status is TaskStatus.PENDING:
        # A fresh attempt: clear the previous attempt's outcome, keep history in the events.
        out.update(started_at=None, finished_at=None, exit_code=None, result="")
        out["borrowed_from"] = ""
        out.update(
            not_before=ev.not_before,
            same_node_id=ev.same_node_id or "",
            avoid_node_ids=ev.avoid_node_ids or (),
            min_vram_mb=ev.min_vram_mb or 0,
        )
        if ev.error is None:
            out["error"] = ""
    elif ev.to_status in (
        TaskStatus.COMPLETED,
        TaskStatus.FAILED,
        TaskStatus.CANCELLED,
        TaskStatus.STOPPED,
    ):
        out["finished_at"] = at
    return out
