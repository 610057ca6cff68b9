"""How agent reports become transitions: table-driven, no servers."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from libs.domain.errors import Conflict
from libs.domain.protocol import AgentReport, Fact, decide_reconcile, decide_report
from libs.domain.task.model import Task, TaskId, TaskSpec, TenantId
from libs.domain.task.states import TaskStatus

S = TaskStatus
AT = datetime(2026, 1, 1, tzinfo=UTC)


def task(status: TaskStatus, **kw: Any) -> Task:
    return Task(
        id=TaskId("t1"),
        tenant_id=TenantId("a"),
        status=status,
        node_id="n1",
        spec=TaskSpec(name="t", image="busybox"),
        created_at=AT,
        updated_at=AT,
        **kw,
    )


def report(fact: Fact, expected: TaskStatus, **kw: Any) -> AgentReport:
    return AgentReport(
        node_id="n1", task_id="t1", attempt=0, fact=fact, expected_status=expected, at=AT, **kw
    )


CASES = [
    ("created", S.SCHEDULED, Fact.STARTING, S.SCHEDULED, {}, S.STARTING),
    ("up", S.STARTING, Fact.RUNNING, S.STARTING, {}, S.RUNNING),
    ("up straight from scheduled", S.SCHEDULED, Fact.RUNNING, S.SCHEDULED, {}, S.RUNNING),
    ("success", S.RUNNING, Fact.EXITED, S.RUNNING, {"exit_code": 0}, S.COMPLETED),
    ("failure", S.RUNNING, Fact.EXITED, S.RUNNING, {"exit_code": 3}, S.FAILED),
    ("oom", S.RUNNING, Fact.EXITED, S.RUNNING, {"exit_code": 137, "oom_killed": True}, S.FAILED),
    ("stopped", S.STOPPING, Fact.EXITED, S.STOPPING, {"exit_code": 0}, S.STOPPED),
    ("preempted", S.PREEMPTING, Fact.EXITED, S.PREEMPTING, {"exit_code": 143}, S.PENDING),
    ("drained", S.DRAINING, Fact.EXITED, S.DRAINING, {"exit_code": 0}, S.CANCELLED),
    (
        "image missing",
        S.SCHEDULED,
        Fact.START_FAILED,
        S.SCHEDULED,
        {"error_kind": "ImageNotFound"},
        S.FAILED,
    ),
    ("woken", S.WAKING, Fact.RESUMED, S.WAKING, {}, S.RUNNING),
    ("lost container", S.RUNNING, Fact.LOST, S.RUNNING, {}, S.FAILED),
]


@pytest.mark.parametrize(
    ("status", "fact", "expected", "kw", "target"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_report_moves_task(
    status: TaskStatus, fact: Fact, expected: TaskStatus, kw: dict[str, Any], target: TaskStatus
) -> None:
    (ev,) = decide_report(task(status), report(fact, expected, **kw))
    assert ev.to_status is target and ev.from_status is status
    if target is S.FAILED:
        assert ev.error
    if target is S.PENDING:
        assert ev.clear_placement


def test_late_success_after_stop_is_a_conflict_and_reconciles_to_stopped() -> None:
    t = task(S.STOPPING)
    late = report(Fact.EXITED, S.RUNNING, exit_code=0)
    with pytest.raises(Conflict):
        decide_report(t, late)
    (ev,) = decide_reconcile(t, late)
    assert ev.to_status is S.STOPPED


@pytest.mark.parametrize(
    ("t", "r"),
    [
        (task(S.RUNNING, retry_count=1), report(Fact.EXITED, S.RUNNING, exit_code=0)),
        (
            task(S.RUNNING).model_copy(update={"node_id": "n2"}),
            report(Fact.EXITED, S.RUNNING, exit_code=0),
        ),
        (task(S.COMPLETED), report(Fact.EXITED, S.COMPLETED, exit_code=0)),
        (task(S.RUNNING), report(Fact.PAUSED, S.RUNNING)),
    ],
    ids=["older attempt", "other node", "already terminal", "paused is no transition"],
)
def test_reports_that_change_nothing(t: Task, r: AgentReport) -> None:
    assert decide_report(t, r) == []
