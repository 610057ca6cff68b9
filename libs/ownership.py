"""Foreign references: one aggregate naming another it does not own (docs/security.md).

A task that claims a job node, a group or a loan it was not created for, or telemetry an
agent sends for a task placed on another node, is never applied: the service that meets it
calls `refuse_foreign`, which logs it and counts it by kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import structlog
from prometheus_client import Counter

from libs.domain.group.model import Group
from libs.domain.job.model import Job, JobNode
from libs.domain.task.model import Task

log = structlog.get_logger(__name__)

FOREIGN_REFERENCES = Counter(
    "heteroflow_foreign_references_total",
    "References to an aggregate the sender does not own, refused and not applied",
    ["kind"],
)


def refuse_foreign(kind: str, why: str, *, count: int = 1, **fields: Any) -> None:
    """Log and count refused references (`kind`: job_task, group_member, loan, telemetry)."""
    FOREIGN_REFERENCES.labels(kind).inc(count)
    log.warning("foreign_reference_refused", kind=kind, why=why, count=count, **fields)


def own_members(group: Group, tasks: Sequence[Task]) -> list[Task]:
    """The tasks the platform created for `group`: of its tenant, naming it, of a generation
    it has reached (the current one, or its rollout's). Any other is refused (logged and
    counted as `group_member`), so no controller acts on it or counts it a member."""
    top = max(group.generation, group.rollout.generation if group.rollout else 0)
    ours: list[Task] = []
    foreign: list[str] = []
    for t in tasks:
        mine = t.tenant_id == group.tenant_id and t.group_id == group.id and t.generation <= top
        if mine:
            ours.append(t)
        else:
            foreign.append(t.id)
    if foreign:
        refuse_foreign(
            "group_member",
            "tasks claiming a group they were not created for",
            count=len(foreign),
            group_id=group.id,
            task_ids=foreign,
        )
    return ours


def foreign_job_task(job: Job, node: JobNode, task: Task) -> str:
    """Why `task` may not settle `node` of `job` ("" when it may): it must be the job
    tenant's, and the task the job created for that node (its id in the job's state; a node
    created before ids were kept is settled by a task of the job's tenant)."""
    if task.tenant_id != job.tenant_id:
        return "the task belongs to another tenant"
    if node.task_id and node.task_id != task.id:
        return f"the job created {node.task_id} for this node"
    return ""
