"""Job events (stream `job-<id>`)."""

from __future__ import annotations

from typing import ClassVar

from libs.domain.job.model import JobStatus, NodeState
from libs.domain.job.spec import JobSpec
from libs.domain.payload import Payload, ReasonedPayload, register
from libs.domain.task.model import TenantId
from libs.domain.task.states import TaskStatus

# --- events ----------------------------------------------------------------------------


class JobSubmitted(Payload):
    """A job was submitted with its validated DAG (its ready tasks are created with it)."""

    type: ClassVar[str] = "job_submitted"
    stream_type: ClassVar[str] = "job"

    job_id: str
    tenant_id: TenantId
    spec: JobSpec


class JobTasksReady(Payload):
    """These tasks' dependencies are met: their tasks are created in the same transaction."""

    type: ClassVar[str] = "job_tasks_ready"
    stream_type: ClassVar[str] = "job"

    job_id: str
    keys: tuple[str, ...]
    # The id of the task created for each key (empty in events written before it was kept):
    # the only task whose end settles that node (services/job_orchestrator).
    task_ids: dict[str, str] = {}


class JobNodeSettled(Payload):
    """A task of the job ended for good, with what it reported."""

    type: ClassVar[str] = "job_node_settled"
    stream_type: ClassVar[str] = "job"

    job_id: str
    key: str
    task_id: str
    outcome: NodeState
    metrics: dict[str, float] = {}
    artifacts: tuple[str, ...] = ()


class JobNodesSkipped(Payload):
    """Tasks that can never run (a dependency will never be met), each with why."""

    type: ClassVar[str] = "job_nodes_skipped"
    stream_type: ClassVar[str] = "job"

    job_id: str
    reasons: dict[str, str]


class JobWaiting(Payload):
    """Why each waiting task still waits (shown by GET /jobs/{id})."""

    type: ClassVar[str] = "job_waiting"
    stream_type: ClassVar[str] = "job"

    job_id: str
    reasons: dict[str, str]


class JobNodeProgress(ReasonedPayload):
    """What the job heard of a created task before its end: it was admitted and placed, it
    went back to pending, or why it still waits (its pending reason). The job's status is
    folded from these: `running` once a task holds resources, `pending` with the binding
    reason while every task waits."""

    type: ClassVar[str] = "job_node_progress"
    stream_type: ClassVar[str] = "job"

    job_id: str
    key: str
    task_id: str
    task_status: TaskStatus
    task_version: int  # the task-stream version of the news (older news is dropped)


class JobStatusChanged(ReasonedPayload):
    """The job's status changed (or, while pending, the reason it waits)."""

    type: ClassVar[str] = "job_status_changed"
    stream_type: ClassVar[str] = "job"

    job_id: str
    from_status: JobStatus
    to_status: JobStatus


class JobStopRequested(Payload):
    """Stop: waiting tasks are skipped, live tasks are stopped."""

    type: ClassVar[str] = "job_stop_requested"
    stream_type: ClassVar[str] = "job"

    job_id: str


class JobDeleted(Payload):
    """Gone from queries; the stream stays."""

    type: ClassVar[str] = "job_deleted"
    stream_type: ClassVar[str] = "job"

    job_id: str


register(
    JobSubmitted,
    JobTasksReady,
    JobNodeSettled,
    JobNodesSkipped,
    JobWaiting,
    JobNodeProgress,
    JobStatusChanged,
    JobStopRequested,
    JobDeleted,
)
