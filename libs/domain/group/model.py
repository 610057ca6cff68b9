"""Task groups (SPEC §5, seed 000): shapes, injected environment, status aggregation.

A group is its own aggregate (stream `grp-…`); members are ordinary tasks carrying
`group_id` and `rank`. Fault tolerance never deletes rows: a replaced member stays as a
"historical remnant" (a terminal row superseded by a newer task of the same rank) and is
ignored by aggregation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from libs.domain.errors import Code, DomainError
from libs.domain.group.autoscale import AutoScale, parse_auto_scale
from libs.domain.group.policy import LastDecision
from libs.domain.group.windows import ScheduleWindow, parse_window
from libs.domain.reasons import ReasonCode
from libs.domain.rollout.model import Rollout
from libs.domain.task.model import Task, TaskSpec, TaskType, TenantId, parse_create
from libs.domain.task.states import TERMINAL, TaskStatus
from libs.domain.validation import is_integer

S = TaskStatus


class Parallelism(StrEnum):
    SPLIT = "split"
    DATA_PARALLEL = "data_parallel"
    TENSOR_PARALLEL = "tensor_parallel"
    PIPELINE_PARALLEL = "pipeline_parallel"


class GroupStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SLEEPING = "sleeping"
    STOPPING = "stopping"
    COMPLETED = "completed"
    FAILED = "failed"
    STOPPED = "stopped"
    # A failed rollout is restoring the old configuration (seed 000, 滚动更新); set by the
    # rollout controller, never by the members' aggregate.
    ROLLBACK = "rollback"


GROUP_TERMINAL = frozenset({GroupStatus.COMPLETED, GroupStatus.FAILED, GroupStatus.STOPPED})
GROUP_FIELDS = frozenset(
    {
        "task_count",
        "parallelism",
        "per_node_gpu",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "master_port",
    }
)


class GroupShape(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    task_count: int = Field(ge=1, le=1024)
    parallelism: Parallelism = Parallelism.SPLIT
    per_node_gpu: int = Field(default=0, ge=0, le=64)
    tensor_parallel_size: int = Field(default=1, ge=1, le=1024)
    pipeline_parallel_size: int = Field(default=1, ge=1, le=1024)
    # Pinned rendezvous port; None: the scheduler allocates one on rank 0's host from the
    # node's port range (docs/groups.md#how-members-reach-each-other).
    master_port: int | None = Field(default=None, ge=1024, le=65535)

    @model_validator(mode="after")
    def _sizes(self) -> GroupShape:
        if self.parallelism is Parallelism.TENSOR_PARALLEL and self.tensor_parallel_size < 2:
            raise ValueError("tensor_parallel requires tensor_parallel_size >= 2")
        if self.parallelism is Parallelism.PIPELINE_PARALLEL and self.pipeline_parallel_size < 2:
            raise ValueError("pipeline_parallel requires pipeline_parallel_size >= 2")
        return self


class GroupSpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    template: TaskSpec
    shape: GroupShape
    schedule_window: ScheduleWindow | None = None
    auto_scale: AutoScale | None = None

    @property
    def is_training(self) -> bool:
        return self.template.task_type is TaskType.TRAINING

    @property
    def static_world(self) -> bool:
        """Training and TP/PP groups: the world is fixed at creation, members cannot rejoin."""
        return self.is_training or self.shape.parallelism in (
            Parallelism.TENSOR_PARALLEL,
            Parallelism.PIPELINE_PARALLEL,
        )

    @property
    def is_inference(self) -> bool:
        return self.template.is_inference

    def member_spec(self, rank: int) -> TaskSpec:
        # The rank is the task's own (`Task.rank`); the static world is the platform's mark.
        platform = self.template.platform.model_copy(update={"static_world": self.static_world})
        update: dict[str, Any] = {
            "platform": platform,
            "name": f"{self.template.name}-{rank}"[:100],
        }
        # With variants each variant names its own cards (docs/groups.md#variants).
        cards = self.template.gpu_required or self.template.variants
        if self.is_training and self.shape.per_node_gpu and not cards:
            update["gpu_required"] = self.shape.per_node_gpu
        return self.template.model_copy(update=update)


def parse_group(
    raw: Any,
    *,
    tenant: bool,
    volume_allow_list: Iterable[str] = (),
    defaults: Mapping[str, Any] | None = None,
) -> GroupSpec:
    if not isinstance(raw, Mapping):
        raise DomainError(Code.INVALID_VALUE, "request body must be a JSON object", ["body"])
    owned = sorted(k for k in ("group_id", "rank") if k in raw)
    if owned:
        raise DomainError(
            Code.SERVER_OWNED_FIELD,
            f"server-owned field(s) cannot be set: {', '.join(owned)}",
            owned,
        )
    template = parse_create(
        {k: v for k, v in raw.items() if k not in GROUP_FIELDS and k not in POLICY_KEYS},
        tenant=tenant,
        volume_allow_list=volume_allow_list,
        defaults=defaults,
    )
    shape_raw = {k: v for k, v in raw.items() if k in GROUP_FIELDS}
    if "task_count" not in shape_raw:
        raise DomainError(Code.INVALID_VALUE, "task_count is required", ["task_count"])
    for key, value in shape_raw.items():
        if key != "parallelism" and not is_integer(value):
            raise DomainError(Code.INVALID_VALUE, f"{key} must be an integer", [key])
    try:
        shape = GroupShape.model_validate(shape_raw)
    except ValidationError as exc:
        fields = [".".join(str(p) for p in e["loc"]) or "parallelism" for e in exc.errors()]
        msg = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise DomainError(Code.INVALID_VALUE, f"invalid value: {msg}", fields) from None
    spec = GroupSpec(template=template, shape=shape)
    if raw.get("schedule_window") is not None:
        window = parse_window(raw["schedule_window"], static_world=spec.static_world)
        spec = spec.model_copy(update={"schedule_window": window})
    if raw.get("auto_scale") is not None:
        spec = spec.model_copy(
            update={"auto_scale": parse_group_auto_scale(raw["auto_scale"], spec)}
        )
    return spec


POLICY_KEYS = frozenset({"schedule_window", "auto_scale"})


def parse_group_auto_scale(raw: Any, spec: GroupSpec) -> AutoScale:
    """`auto_scale` of a group: valid on its own, and only on a group that can be scaled."""
    cfg = parse_auto_scale(raw)
    if spec.static_world:
        why = "task_type=training" if spec.is_training else f"parallelism={spec.shape.parallelism}"
        raise DomainError(
            Code.INVALID_VALUE,
            f"auto_scale: a static-world group ({why}) has a world size fixed at creation",
            ["auto_scale"],
        )
    return cfg


class Group(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    tenant_id: TenantId
    spec: GroupSpec
    status: GroupStatus = GroupStatus.PENDING
    reason: str = ""
    reason_code: ReasonCode = ReasonCode.UNSPECIFIED
    restarts: int = 0
    rebuilds: int = 0
    replacements: int = 0
    restart_due_at: datetime | None = None
    failed_at: datetime | None = None
    replicas: int | None = None  # set by a scale; None = the shape's task_count
    scaled_at: datetime | None = None  # the last scale, either way (AutoScaler cooldowns)
    scaled_up_at: datetime | None = None
    last_autoscale: LastDecision | None = None
    labels: dict[str, str] = Field(default_factory=dict)  # group-level, e.g. window state
    # Rolling update (docs/rollout.md): the members' current generation and the last rollout.
    generation: int = 0
    rollout: Rollout | None = None
    version: int = 0
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None = None

    @property
    def size(self) -> int:
        """The current replica count: ranks `0..size-1` are members, higher ranks are gone."""
        return self.spec.shape.task_count if self.replicas is None else self.replicas


# --- membership and aggregation ----------------------------------------------------------


def current_members(tasks: Sequence[Task]) -> list[Task]:
    """The newest live task of each rank, else its newest task; older rows of a rank are
    historical remnants. (Two live tasks of one rank exist only during a rollout: the new
    generation's replica is the member; after a rollback the restored old one is.)"""
    newest: dict[int, Task] = {}
    for t in tasks:
        if t.rank is None:
            continue
        seen = newest.get(t.rank)
        if seen is None or (is_live(t), t.created_at, t.id) > (
            is_live(seen),
            seen.created_at,
            seen.id,
        ):
            newest[t.rank] = t
    return [newest[r] for r in sorted(newest)]


def sized_members(group: Group, members: Sequence[Task]) -> list[Task]:
    """The members within the group's current size (ranks scaled away are left out); a
    group never scaled keeps every member, one scaled to zero keeps its ended members so
    that it reads as stopped."""
    if group.replicas is None:
        return list(members)
    within = [m for m in members if m.rank is not None and m.rank < group.size]
    return within if within or group.size else list(members)


def aggregate_status(members: Sequence[Task], *, replicas: bool = False) -> GroupStatus:
    """Seed 000: a failed member → failed; all running → running; all sleeping → sleeping;
    all terminal → completed (stopped when any was stopped or cancelled); else pending.

    `replicas`: a stateless replica group stays running while any replica runs (a replaced
    rank starting up does not take the service down).
    """
    statuses = [m.status for m in members]
    if not statuses:
        return GroupStatus.PENDING
    if S.FAILED in statuses:
        return GroupStatus.FAILED
    if all(s is S.RUNNING for s in statuses):
        return GroupStatus.RUNNING
    if (
        replicas
        and S.RUNNING in statuses
        and not any(s in (S.STOPPING, S.DRAINING) for s in statuses)
    ):
        return GroupStatus.RUNNING
    if all(s is S.SLEEPING for s in statuses):
        return GroupStatus.SLEEPING
    if all(s in TERMINAL for s in statuses):
        if all(s is S.COMPLETED for s in statuses):
            return GroupStatus.COMPLETED
        return GroupStatus.STOPPED
    if any(s in (S.STOPPING, S.DRAINING) for s in statuses) and not any(
        s in (S.PENDING, S.SCHEDULED, S.STARTING) for s in statuses
    ):
        return GroupStatus.STOPPING
    if any(s is S.RUNNING for s in statuses) and all(
        s in (S.RUNNING, S.COMPLETED, S.SLEEPING, S.WAKING) for s in statuses
    ):
        return GroupStatus.RUNNING
    return GroupStatus.PENDING


def is_live(task: Task) -> bool:
    return task.status not in TERMINAL


# --- injected environment ----------------------------------------------------------------

BACKEND_BY_VENDOR = {"nvidia": "nccl", "amd": "nccl", "huawei": "hccl", "intel": "ccl"}


DEFAULT_MASTER_PORT = 29500


def group_env(
    spec: GroupSpec,
    rank: int,
    master_addr: str,
    nnodes: int,
    vendor: str,
    master_port: int | None = None,
) -> dict[str, str]:
    """Distributed environment for one member (SPEC §5); the caller lets user values win.

    `master_port`: the port allocated on rank 0's host; without one (a placement made before
    ports were allocated) the pinned port, else the conventional 29500."""
    shape = spec.shape
    port = master_port or shape.master_port or DEFAULT_MASTER_PORT
    per_node = shape.per_node_gpu if spec.is_training else 1
    per_node = max(per_node, 1)
    nodes = shape.task_count if spec.is_training else nnodes
    env = {
        "WORLD_SIZE": str(shape.task_count * per_node),
        "NNODES": str(nodes),
        "NODE_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(per_node),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(port),
        "DIST_BACKEND": BACKEND_BY_VENDOR.get(vendor.lower(), "gloo"),
    }
    if shape.parallelism is Parallelism.TENSOR_PARALLEL:
        env["TENSOR_PARALLEL_SIZE"] = str(shape.tensor_parallel_size)
    if shape.parallelism is Parallelism.PIPELINE_PARALLEL:
        env["PIPELINE_PARALLEL_SIZE"] = str(shape.pipeline_parallel_size)
    if per_node == 1:
        # One process per container is provable only here; with several, each process's
        # rank is the launcher's (torchrun, deepspeed) to derive.
        env["RANK"] = str(rank)
        env["LOCAL_RANK"] = "0"
    return env
