"""Rolling update of a task group: the request a user sends and the per-task decisions.

What a rollout may change (image, env, volumes) and how fast (max_surge, max_unavailable,
partition, health_timeout_s) is validated here with the entry discipline of SPEC §2: unknown
fields are named, values are checked, a static-world group is refused with the alternative
(`strategy: recreate`), because replacing ranks of a fixed world one by one is a restart.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import Code, DomainError
from .events import TaskDrainMarked
from .group import GroupSpec
from .reasons import ReasonCode
from .states import TERMINAL
from .task import Task, Volume, normalise_env

DEFAULT_HEALTH_TIMEOUT_S = 300
MAX_HEALTH_TIMEOUT_S = 3600


class RolloutRequest(BaseModel):
    """`POST /task-groups/{id}/rollout`: the new configuration and the pace of the update."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str | None = Field(default=None, min_length=1, max_length=512)
    env: dict[str, str] | None = None
    volumes: tuple[Volume, ...] | None = None
    max_surge: int = Field(default=1, ge=1, le=64)
    max_unavailable: int = Field(default=0, ge=0, le=64)
    # Replicas (by rank) to update; None: all of them.
    partition: int | None = Field(default=None, ge=0)
    health_timeout_s: int = Field(default=DEFAULT_HEALTH_TIMEOUT_S, ge=1, le=MAX_HEALTH_TIMEOUT_S)
    strategy: Literal["rolling", "recreate"] = "rolling"

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> Any:
        return None if v is None else normalise_env(v)


FIELDS: frozenset[str] = frozenset(RolloutRequest.model_fields)


def parse_rollout(raw: Any, group: GroupSpec) -> RolloutRequest:
    """The validated request, or a DomainError naming every field that is wrong."""
    if not isinstance(raw, dict):
        raise DomainError(Code.INVALID_VALUE, "the body must be a JSON object", ["body"])
    unknown = sorted(k for k in raw if k not in FIELDS)
    if unknown:
        raise DomainError(Code.UNKNOWN_FIELD, f"unknown field(s): {', '.join(unknown)}", unknown)
    try:
        req = RolloutRequest.model_validate(raw)
    except ValidationError as exc:
        fields = sorted({".".join(str(x) for x in e["loc"]) or "body" for e in exc.errors()})
        raise DomainError(
            Code.INVALID_VALUE, f"invalid value(s): {', '.join(fields)}", fields
        ) from exc
    if req.image is None and req.env is None and req.volumes is None:
        raise DomainError(
            Code.INVALID_VALUE, "nothing to roll out: give image, env or volumes", ["image"]
        )
    if group.static_world and req.strategy == "rolling":
        raise DomainError(
            Code.INVALID_VALUE,
            "a rolling update of a static-world (training) group is a restart of the whole "
            'world: send "strategy": "recreate" to restart it with the new configuration',
            ["strategy"],
        )
    return req


def decide_drain(task: Task) -> list[TaskDrainMarked]:
    """Mark an old-generation replica draining; nothing when it already is or has ended."""
    if task.draining or task.status in TERMINAL:
        return []
    code = ReasonCode.ROLLOUT_DRAIN
    return [TaskDrainMarked(task_id=task.id, reason_code=code, reason=code.text)]
