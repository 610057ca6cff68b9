"""Rollout events, on the group's stream."""

from __future__ import annotations

from typing import ClassVar

from libs.domain.payload import Payload, ReasonedPayload, register
from libs.domain.rollout.model import BatchStep, RolloutPhase, RolloutRequest
from libs.domain.task.model import TaskSpec


class RolloutStarted(Payload):
    """A rollout took the group: its generation goes up by one (one compare-and-set)."""

    type: ClassVar[str] = "rollout_started"
    stream_type: ClassVar[str] = "group"

    group_id: str
    rollout_id: str
    generation: int
    request: RolloutRequest
    previous: TaskSpec
    target: TaskSpec


class RolloutPhaseChanged(ReasonedPayload):
    """Paused, resumed, rolling back, completed or failed."""

    type: ClassVar[str] = "rollout_phase_changed"
    stream_type: ClassVar[str] = "group"

    group_id: str
    rollout_id: str
    from_phase: RolloutPhase
    to_phase: RolloutPhase


class RolloutPartitionChanged(Payload):
    """The canary partition moved (raising it continues the update to more ranks)."""

    type: ClassVar[str] = "rollout_partition_changed"
    stream_type: ClassVar[str] = "group"

    group_id: str
    rollout_id: str
    partition: int | None


class RolloutBatchRecorded(Payload):
    """The rollout controller moved a batch on (started, ready, drain, done, failed, ...)."""

    type: ClassVar[str] = "rollout_batch_recorded"
    stream_type: ClassVar[str] = "group"

    group_id: str
    rollout_id: str
    number: int
    attempt: int
    step: BatchStep
    ranks: tuple[int, ...]
    task_ids: tuple[str, ...] = ()
    reason: str = ""


class RolloutLeaseRenewed(Payload):
    """The rollout controller took or renewed the group's rollout lease (TTL 60 s)."""

    type: ClassVar[str] = "rollout_lease_renewed"
    stream_type: ClassVar[str] = "group"

    group_id: str
    rollout_id: str
    holder: str


class RolloutLeaseReleased(Payload):
    """A controller instance stopping gracefully (or deposed) gave the group's rollout lease
    up: the next holder takes it at once and resumes the rollout from its durable state."""

    type: ClassVar[str] = "rollout_lease_released"
    stream_type: ClassVar[str] = "group"

    group_id: str
    rollout_id: str
    holder: str


register(
    RolloutStarted,
    RolloutPhaseChanged,
    RolloutPartitionChanged,
    RolloutBatchRecorded,
    RolloutLeaseRenewed,
    RolloutLeaseReleased,
)

ROLLOUT_EVENTS = (
    RolloutStarted,
    RolloutPhaseChanged,
    RolloutPartitionChanged,
    RolloutBatchRecorded,
    RolloutLeaseRenewed,
    RolloutLeaseReleased,
)
