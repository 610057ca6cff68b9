"""A job as its events made it: statuses and nodes."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from libs.domain.job.spec import JobSpec
from libs.domain.reasons import ReasonCode
from libs.domain.task.model import TenantId
from libs.domain.task.states import TaskStatus

METRICS_MARK = "HF_METRICS "
ARTIFACT_MARK = "HF_ARTIFACT "


class JobStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


JOB_TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED})


class NodeState(StrEnum):
    WAITING = "waiting"  # dependencies not met yet: no task exists
    CREATED = "created"  # its task exists (its own status says where it is)
    COMPLETED = "completed"
    FAILED = "failed"  # failed for good (retries exhausted or permanent)
    STOPPED = "stopped"  # stopped or cancelled
    SKIPPED = "skipped"  # can never run: a dependency will never be met


SETTLED = frozenset({NodeState.COMPLETED, NodeState.FAILED, NodeState.STOPPED})
DONE = SETTLED | {NodeState.SKIPPED}


class JobNode(BaseModel):
    model_config = ConfigDict(frozen=True)

    key: str
    state: NodeState = NodeState.WAITING
    reason: str = ""  # why it waits, or why it was skipped
    task_id: str = ""
    metrics: dict[str, float] = {}
    artifacts: tuple[str, ...] = ()
    # What the job last heard of its created task (`JobNodeProgress`): the task's status (None:
    # created, not heard of since), the task-stream version it was heard at (older news is
    # dropped), and while the task is pending, why it waits.
    task_status: TaskStatus | None = None
    task_version: int = 0
    pending_code: ReasonCode | None = None
    pending_reason: str = ""

    @property
    def holding(self) -> bool:
        """Its task was admitted and placed: it holds (or held) resources, and has not gone
        back to waiting. A task just created, or pending again, does not."""
        return self.state is NodeState.CREATED and self.task_status not in (
            None,
            TaskStatus.PENDING,
        )


class Job(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    tenant_id: TenantId
    spec: JobSpec
    status: JobStatus = JobStatus.PENDING
    reason: str = ""
    # The code of the last status change: while pending, the binding reason
    # (queue_quota_exceeded, pool_capacity, ...) of the task that waits.
    reason_code: ReasonCode = ReasonCode.SUBMITTED
    nodes: dict[str, JobNode]
    stop_requested: bool = False
    version: int = 0
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    deleted_at: datetime | None = None
