"""A job's status folded from what it heard of its tasks: `running` only once a task holds
resources, `pending` with the binding reason while every task waits (issue 29, item 1)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from libs.domain.job.decide import advance, progress
from libs.domain.job.events import JobNodeProgress, JobNodeSettled, JobSubmitted
from libs.domain.job.evolve import evolve_job
from libs.domain.job.model import Job, JobStatus, NodeState
from libs.domain.job.spec import parse_job
from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.task.model import TenantId
from libs.domain.task.states import TaskStatus

NOW = datetime(2026, 1, 1, tzinfo=UTC)
S = TaskStatus
QUOTA = (ReasonCode.QUEUE_QUOTA_EXCEEDED, "queue 'serial' runs its max_running_jobs 1")
FULL = (ReasonCode.POOL_CAPACITY, "pool(s) all of queue 'serial' full")


def apply(j: Job, events: list[Payload]) -> Job:
    for ev in events:
        j = evolve_job(j, ev, NOW, j.version + 1)
    return j


def submitted(keys: list[str], deps: list[dict[str, str]] | None = None) -> Job:
    body = {
        "name": "j",
        "tasks": [{"key": k, "name": k, "image": "busybox:latest"} for k in keys],
        "dependencies": deps or [],
    }
    spec = parse_job(body, tenant=True)
    j = evolve_job(None, JobSubmitted(job_id="job-1", tenant_id=TenantId("t"), spec=spec), NOW, 1)
    events, _ = advance(j)
    return apply(j, events)


def news(
    key: str, status: TaskStatus, version: int, why: tuple[ReasonCode, str] | None = None
) -> JobNodeProgress:
    code, reason = why or (ReasonCode.UNSPECIFIED, "")
    return JobNodeProgress(
        job_id="job-1",
        key=key,
        task_id="",
        task_status=status,
        task_version=version,
        reason_code=code,
        reason=reason,
    )


def hear(j: Job, *heard: JobNodeProgress) -> Job:
    for h in heard:
        j = apply(j, progress(j, h))
    return j


CASES = [
    pytest.param(
        [], JobStatus.PENDING, ReasonCode.SUBMITTED, "waiting for placement", id="created"
    ),
    pytest.param(
        [news("a", S.PENDING, 2, QUOTA)],
        JobStatus.PENDING,
        ReasonCode.QUEUE_QUOTA_EXCEEDED,
        "task 'a': queue 'serial' runs its max_running_jobs 1",
        id="waits-on-its-queue",
    ),
    pytest.param(
        [news("a", S.PENDING, 2, QUOTA), news("a", S.PENDING, 3, FULL)],
        JobStatus.PENDING,
        ReasonCode.POOL_CAPACITY,
        "task 'a': pool(s) all",
        id="waits-on-its-pool",
    ),
    pytest.param(
        [news("a", S.PENDING, 2, QUOTA), news("a", S.SCHEDULED, 3)],
        JobStatus.RUNNING,
        None,
        "",
        id="placed",
    ),
    pytest.param(
        [news("a", S.RUNNING, 3), news("a", S.PENDING, 6, (ReasonCode.NODE_OFFLINE, "node gone"))],
        JobStatus.PENDING,
        ReasonCode.NODE_OFFLINE,
        "task 'a': node gone",
        id="back-to-pending-on-a-lost-node",
    ),
    pytest.param(
        [news("a", S.SCHEDULED, 5), news("a", S.PENDING, 2, QUOTA)],
        JobStatus.RUNNING,
        None,
        "",
        id="old-news-is-dropped",
    ),
]


@pytest.mark.parametrize(("heard", "status", "code", "text"), CASES)
def test_a_one_task_job(
    heard: list[JobNodeProgress], status: JobStatus, code: ReasonCode | None, text: str
) -> None:
    j = hear(submitted(["a"]), *heard)
    assert j.status is status
    if code is not None:
        assert j.reason_code is code and text in j.reason, (j.reason_code, j.reason)


def test_running_while_one_task_holds_and_another_waits() -> None:
    j = hear(submitted(["a", "b"]), news("a", S.SCHEDULED, 3), news("b", S.PENDING, 2, FULL))
    assert j.status is JobStatus.RUNNING
    j = hear(j, news("a", S.PENDING, 7, QUOTA))  # a preempted back: nothing holds now
    assert (j.status, j.reason_code) == (JobStatus.PENDING, ReasonCode.QUEUE_QUOTA_EXCEEDED)
    assert j.reason.startswith("task 'a': ")  # the first waiting task, in the job's order


def test_a_later_stage_that_waits_makes_the_job_pending_again() -> None:
    j = hear(submitted(["a", "b"], [{"task": "b", "on": "a"}]), news("a", S.RUNNING, 4))
    assert j.status is JobStatus.RUNNING
    settled = JobNodeSettled(job_id=j.id, key="a", task_id="", outcome=NodeState.COMPLETED)
    j = apply(j, [settled])
    events, ready = advance(j)
    j = apply(j, events)
    assert ready == ["b"] and j.status is JobStatus.PENDING
    j = hear(j, news("b", S.PENDING, 2, QUOTA), news("b", S.SCHEDULED, 3))
    assert j.status is JobStatus.RUNNING


def test_news_that_changes_nothing_is_not_recorded() -> None:
    j = hear(submitted(["a"]), news("a", S.SCHEDULED, 3))
    assert progress(j, news("a", S.RUNNING, 5)) == []  # placed either way
    waiting = hear(submitted(["a"]), news("a", S.PENDING, 2, QUOTA))
    assert progress(waiting, news("a", S.PENDING, 4, QUOTA)) == []  # the same reason again
    assert progress(waiting, news("a", S.PENDING, 1, FULL)) == []  # older than what it knows


def test_a_status_change_is_recorded_with_the_news() -> None:
    j = submitted(["a"])
    events = progress(j, news("a", S.PENDING, 2, QUOTA))
    assert [e.type for e in events] == ["job_node_progress", "job_status_changed"]
    events = progress(apply(j, events), news("a", S.SCHEDULED, 3))
    assert [e.type for e in events] == ["job_node_progress", "job_status_changed"]
    assert events[1].model_dump()["to_status"] == "running"


def test_news_of_a_task_that_is_not_the_nodes_is_ignored() -> None:
    j = submitted(["a"])
    j = j.model_copy(
        update={"nodes": {"a": j.nodes["a"].model_copy(update={"task_id": "task-real"})}}
    )
    stray = news("a", S.SCHEDULED, 3).model_copy(update={"task_id": "task-other"})
    assert progress(j, stray) == []
