"""The job fold."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from libs.domain.job.events import (
    JobDeleted,
    JobNodeProgress,
    JobNodeSettled,
    JobNodesSkipped,
    JobStatusChanged,
    JobStopRequested,
    JobSubmitted,
    JobTasksReady,
    JobWaiting,
)
from libs.domain.job.model import JOB_TERMINAL, Job, JobNode, NodeState
from libs.domain.payload import Payload
from libs.domain.task.states import TaskStatus


def _set_nodes(job: Job, changes: Mapping[str, Mapping[str, Any]]) -> dict[str, JobNode]:
    nodes = dict(job.nodes)
    for key, change in changes.items():
        nodes[key] = nodes[key].model_copy(update=dict(change))
    return nodes


def evolve_job(job: Job | None, event: Payload, at: datetime, version: int) -> Job:
    if isinstance(event, JobSubmitted):
        nodes = {n.key: JobNode(key=n.key) for n in event.spec.tasks}
        return Job(
            id=event.job_id,
            tenant_id=event.tenant_id,
            spec=event.spec,
            nodes=nodes,
            version=version,
            created_at=at,
            updated_at=at,
        )
    if job is None:
        raise ValueError(f"{event.type} before job_submitted")
    up: dict[str, Any] = {"version": version, "updated_at": at}
    if isinstance(event, JobTasksReady):
        ready = {
            k: {"state": NodeState.CREATED, "reason": "", "task_id": event.task_ids.get(k, "")}
            for k in event.keys
        }
        up["nodes"] = _set_nodes(job, ready)
    elif isinstance(event, JobNodeSettled):
        settled = {
            "state": event.outcome,
            "task_id": event.task_id,
            "metrics": event.metrics,
            "artifacts": event.artifacts,
            "reason": "",
        }
        up["nodes"] = _set_nodes(job, {event.key: settled})
    elif isinstance(event, JobNodesSkipped):
        skips = {k: {"state": NodeState.SKIPPED, "reason": r} for k, r in event.reasons.items()}
        up["nodes"] = _set_nodes(job, skips)
    elif isinstance(event, JobWaiting):
        up["nodes"] = _set_nodes(job, {k: {"reason": r} for k, r in event.reasons.items()})
    elif isinstance(event, JobNodeProgress):
        pending = event.task_status is TaskStatus.PENDING
        heard = {
            "task_status": event.task_status,
            "task_version": event.task_version,
            "pending_code": event.reason_code if pending else None,
            "pending_reason": event.reason if pending else "",
        }
        up["nodes"] = _set_nodes(job, {event.key: heard})
    elif isinstance(event, JobStatusChanged):
        up.update(status=event.to_status, reason=event.reason, reason_code=event.reason_code)
        if event.to_status in JOB_TERMINAL:
            up["finished_at"] = at
    elif isinstance(event, JobStopRequested):
        up["stop_requested"] = True
    elif isinstance(event, JobDeleted):
        up["deleted_at"] = at
    else:
        raise ValueError(f"not a job event: {event.type}")
    return job.model_copy(update=up)
