"""A job as its events made it: statuses and nodes."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from libs.domain.job.spec import JobSpec
from libs.domain.task.model import TenantId

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


class Job(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    tenant_id: TenantId
    spec: JobSpec
    status: JobStatus = JobStatus.PENDING
    reason: str = ""
    nodes: dict[str, JobNode]
    stop_requested: bool = False
    version: int = 0
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    deleted_at: datetime | None = None
