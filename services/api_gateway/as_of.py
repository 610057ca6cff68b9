"""`?as_of=<RFC 3339 time>` on the reads of one task, group, job or node.

The answer is the read's own view of the aggregate folded from the event log up to that time
(libs/store/as_of.py), with the same visibility rules as the live read: another tenant's, a
deleted one, or one that did not exist yet answers 404. A group's members and a job's tasks
are folded to the same time.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated

from fastapi import Depends
from pydantic import Field

from libs.domain.errors import Code, DomainError, NotFound
from libs.domain.group.model import Group
from libs.domain.job.model import Job
from libs.domain.node.model import Node
from libs.domain.task.model import Task
from libs.store import as_of as folds
from libs.store import tasks as task_rows
from libs.store.eventstore import EventStore
from libs.store.projections import GROUPS, JOBS, NODES, TASKS

from .schemas import QueryModel, query_of

# RFC 3339's date-time (section 5.6), the only form `as_of` takes: ISO 8601's other forms
# (week dates, basic format, an hour alone, no offset) are refused.
RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})", re.ASCII
)


class AsOfQuery(QueryModel):
    as_of: str = Field(
        default="",
        max_length=64,
        description=(
            "an RFC 3339 time with its UTC offset (e.g. 2026-12-01T12:00:00Z): the state "
            "folded from the event log up to that time; absent: the live state"
        ),
        json_schema_extra={"format": "date-time"},
    )

    def at(self) -> datetime | None:
        """The time asked for, or None for the live state (no `as_of` given); 400/40003 for
        anything but an RFC 3339 date-time, an empty value included."""
        if "as_of" not in self.model_fields_set:
            return None
        at: datetime | None = None
        if RFC3339.fullmatch(self.as_of):
            try:
                at = datetime.fromisoformat(self.as_of.upper().replace("Z", "+00:00"))
            except ValueError:  # a day or hour out of range (2026-02-30, 25:00)
                at = None
        if at is None:
            raise DomainError(
                Code.INVALID_VALUE,
                "as_of must be an RFC 3339 time with a UTC offset, e.g. 2026-12-01T12:00:00Z"
                f" (got {self.as_of!r})",
                ["as_of"],
            )
        return at


AsOf = Annotated[AsOfQuery, Depends(query_of(AsOfQuery))]


async def task_at(store: EventStore, task_id: str, tenant: str | None, at: datetime) -> Task:
    task: Task | None = await folds.one_up_to(store, TASKS.stream_type, task_id, at)
    if task is None or task.deleted_at is not None or (tenant and task.tenant_id != tenant):
        raise NotFound("task")
    return task


async def group_at(
    store: EventStore, group_id: str, tenant: str | None, at: datetime
) -> tuple[Group, list[Task]]:
    """The group then, and its members then (as the live read: deleted ones left out)."""
    group: Group | None = await folds.one_up_to(store, GROUPS.stream_type, group_id, at)
    if group is None or group.deleted_at is not None or (tenant and group.tenant_id != tenant):
        raise NotFound("task group")
    ids = [t.id for t in await task_rows.of_group(store, group_id, include_deleted=True)]
    members = await folds.fold_up_to(store, TASKS.stream_type, ids, at)
    return group, [t for t in members.values() if t.deleted_at is None]


async def job_at(
    store: EventStore, job_id: str, tenant: str | None, at: datetime
) -> tuple[Job, list[Task]]:
    """The job then, and the tasks created for it by then (created_at order, as live)."""
    job: Job | None = await folds.one_up_to(store, JOBS.stream_type, job_id, at)
    if job is None or job.deleted_at is not None or (tenant and job.tenant_id != tenant):
        raise NotFound("job")
    ids = [t.id for t in await task_rows.of_job(store, job_id)]
    tasks = await folds.fold_up_to(store, TASKS.stream_type, ids, at)
    order = {task_id: i for i, task_id in enumerate(ids)}
    return job, sorted(tasks.values(), key=lambda t: (t.created_at, order[t.id]))


async def node_at(store: EventStore, node_id: str, at: datetime) -> Node:
    node: Node | None = await folds.one_up_to(store, NODES.stream_type, node_id, at)
    if node is None:
        raise NotFound("node")
    return node
