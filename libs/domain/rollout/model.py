"""The rollout of a group as data: the request, the state a group carries, and its events.

Kept apart from `rollout.py` (the decisions) so that `group.py` can fold these events into
the group without an import cycle.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from libs.domain.reasons import ReasonCode
from libs.domain.task.model import TaskSpec, Volume, normalise_env
from libs.domain.validation import exactly_int

DEFAULT_HEALTH_TIMEOUT_S = 300
MAX_HEALTH_TIMEOUT_S = 3600


class RolloutRequest(BaseModel):
    """`POST /task-groups/{id}/rollout`: the new configuration and the pace of the update."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str | None = Field(default=None, min_length=1, max_length=512)
    env: dict[str, str] | None = None
    volumes: tuple[Volume, ...] | None = None
    # Kubernetes Deployment semantics: at most `max_surge` replicas beyond the group's size,
    # at most `max_unavailable` old replicas out of service before their replacements are
    # healthy (both 0 is refused: the rollout could never move).
    max_surge: int = Field(default=1, ge=0, le=64)
    max_unavailable: int = Field(default=0, ge=0, le=64)
    # Replicas (by rank) to update; None: all of them.
    partition: int | None = Field(default=None, ge=0)
    health_timeout_s: int = Field(default=DEFAULT_HEALTH_TIMEOUT_S, ge=1, le=MAX_HEALTH_TIMEOUT_S)
    strategy: Literal["rolling", "recreate"] = "rolling"

    _ints = field_validator(
        "max_surge", "max_unavailable", "partition", "health_timeout_s", mode="before"
    )(exactly_int)

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> Any:
        return None if v is None else normalise_env(v)


FIELDS: frozenset[str] = frozenset(RolloutRequest.model_fields)


class RolloutPhase(StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    ROLLBACK = "rollback"
    COMPLETED = "completed"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"  # a requested rollback finished: the previous config serves


# Phases in which a rollout holds the group: no second one may start.
ACTIVE = frozenset({RolloutPhase.RUNNING, RolloutPhase.PAUSED, RolloutPhase.ROLLBACK})


class BatchStep(StrEnum):
    """What happened to a batch (one entry of the rollout's history each)."""

    # The old replicas of the ranks beyond `max_surge` (all ranks under `recreate`) are
    # taken out of service first; their replacements are created once they have ended.
    DOWN = "down"
    STARTED = "started"  # new-generation replicas created for these ranks
    READY = "ready"  # every new replica of the batch is running and healthy
    DRAIN = "drain"  # the old replicas of the batch were marked draining
    DONE = "done"  # the old replicas ended cancelled: the ranks are replaced
    FAILED = "failed"  # a new replica failed or was not healthy in time
    RESTORED = "restored"  # rollback: old-configuration replicas rebuilt for these ranks


class BatchRecord(BaseModel):
    """One step of one batch, as the rollout's history shows it."""

    model_config = ConfigDict(frozen=True)

    number: int  # 1, 2, ... (a retry keeps its batch's number)
    attempt: int  # 1 = first try
    step: BatchStep
    ranks: tuple[int, ...]
    task_ids: tuple[str, ...] = ()
    at: datetime
    reason: str = ""


class Rollout(BaseModel):
    """The group's current (or last) rollout as its events made it."""

    model_config = ConfigDict(frozen=True)

    id: str
    generation: int
    from_generation: int
    request: RolloutRequest
    # The member template before and after: a rollback rebuilds `previous`.
    previous: TaskSpec
    target: TaskSpec
    phase: RolloutPhase = RolloutPhase.RUNNING
    reason_code: ReasonCode = ReasonCode.UNSPECIFIED
    reason: str = ""
    started_at: datetime
    updated_at: datetime
    batches: tuple[BatchRecord, ...] = ()
    # The controller instance that holds the group's rollout lease and when it last renewed
    # it ("" / None: not taken yet). A lease not renewed within its TTL has expired.
    holder: str = ""
    lease_renewed_at: datetime | None = None
    # The last `paused → running`: the health timeout of the batch in progress restarts here.
    resumed_at: datetime | None = None

    @property
    def current(self) -> BatchRecord | None:
        """The last history entry of the batch in progress (None: between batches)."""
        if not self.batches or self.batches[-1].step in (BatchStep.DONE, BatchStep.RESTORED):
            return None
        return self.batches[-1]
