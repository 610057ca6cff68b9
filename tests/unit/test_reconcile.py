"""Reconcile decisions for an agent back after an outage, and the confirmation sweep's clocks:
pure functions and in-memory state, no servers."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from agent.runtimes.base import Handle
from agent.service import newest_attempts
from libs.domain.errors import Conflict
from libs.domain.protocol import AgentReport, Fact, decide_reconcile, decide_report
from libs.domain.reasons import ReasonCode
from libs.domain.task.events import TaskStatusChanged
from libs.domain.task.model import Task, TaskId, TaskSpec, TenantId
from libs.domain.task.states import TaskStatus
from services.scheduler.controllers.confirm import SWEPT, Confirmations
from services.scheduler.controllers.node_monitor import ON_NODE_LOSS, migrate_decision

S = TaskStatus
AT = datetime(2026, 1, 1, tzinfo=UTC)


def task(status: TaskStatus, node: str | None = "n1", **kw: Any) -> Task:
    return Task(
        id=TaskId("t1"),
        tenant_id=TenantId("a"),
        status=status,
        node_id=node,
        spec=TaskSpec(name="t", image="busybox"),
        created_at=AT,
        updated_at=AT,
        **kw,
    )


def exited(code: int, *, node: str = "n1", attempt: int = 0) -> AgentReport:
    return AgentReport(
        node_id=node,
        task_id="t1",
        attempt=attempt,
        fact=Fact.EXITED,
        expected_status=S.RUNNING,
        exit_code=code,
        output_tail=["done"],
        at=AT,
    )


@pytest.mark.parametrize(
    ("code", "outcome", "status"),
    [
        (0, S.COMPLETED, S.SCHEDULED),
        (3, S.FAILED, S.SCHEDULED),
        # The `running` report redelivered after the exit (a scheduler killed with both
        # unacknowledged): the exit still records the edge the container took.
        (0, S.COMPLETED, S.STARTING),
        (3, S.FAILED, S.STARTING),
    ],
)
def test_exit_for_a_task_placed_again_on_its_node_takes_the_real_outcome(
    code: int, outcome: TaskStatus, status: TaskStatus
) -> None:
    # Back after an outage, the attempt placed on the same node again (or its `running`
    # report late): the agent's exit (it expected `running`) is stale, and the reconcile
    # records what the container did, through `running`.
    t = task(status)
    with pytest.raises(Conflict):
        decide_report(t, exited(code))
    events = decide_reconcile(t, exited(code))
    assert [(e.from_status, e.to_status) for e in events] == [
        (status, S.RUNNING),
        (S.RUNNING, outcome),
    ]
    assert events[-1].exit_code == code


def test_exit_for_a_task_placed_elsewhere_or_retried_changes_nothing() -> None:
    assert decide_reconcile(task(S.SCHEDULED, node="n2"), exited(0)) == []
    assert decide_reconcile(task(S.SCHEDULED, retry_count=1), exited(0)) == []
    assert decide_reconcile(task(S.PENDING, node=None), exited(0)) == []


def test_newest_attempt_is_adopted_and_the_older_ones_are_stopped() -> None:
    def h(task_id: str, attempt: int) -> Handle:
        return Handle(runtime="docker", id=f"{task_id}-{attempt}", task_id=task_id, attempt=attempt)

    keep, older = newest_attempts([h("a", 0), h("a", 2), h("b", 0), h("a", 1)])
    assert sorted((x.task_id, x.attempt) for x in keep) == [("a", 2), ("b", 0)]
    assert sorted((x.task_id, x.attempt) for x in older) == [("a", 0), ("a", 1)]


def test_unconfirmed_placement_is_overdue_only_after_the_bound() -> None:
    c = Confirmations(after_s=30.0)
    placed = [("t1", "n1", S.RUNNING), ("t2", "n1", S.SCHEDULED)]
    assert c.overdue(placed, now=100.0) == []  # first met: the clocks start
    c.confirm("n1", ["t1"], now=120.0)
    c.confirm("n2", ["t2"], now=125.0)  # another node listing it does not confirm it
    assert c.overdue(placed, now=131.0) == [("t2", "n1", S.SCHEDULED)]
    assert c.overdue(placed, now=151.0) == placed


def test_a_new_status_or_placement_restarts_the_clock() -> None:
    c = Confirmations(after_s=30.0)
    c.overdue([("t1", "n1", S.SCHEDULED)], now=0.0)
    assert c.overdue([("t1", "n1", S.STARTING)], now=40.0) == []
    assert c.overdue([("t1", "n2", S.STARTING)], now=80.0) == []
    assert c.overdue([("t1", "n2", S.STARTING)], now=111.0) == [("t1", "n2", S.STARTING)]


@pytest.mark.parametrize("status", sorted(SWEPT))
def test_overdue_task_is_resolved_through_the_state_machine(status: TaskStatus) -> None:
    decide = migrate_decision("n1", ON_NODE_LOSS, ReasonCode.TASK_UNCONFIRMED, "unconfirmed")
    [event] = decide(task(status))
    assert isinstance(event, TaskStatusChanged)
    assert event.to_status is ON_NODE_LOSS[status]
    assert event.reason_code is ReasonCode.TASK_UNCONFIRMED
    assert decide(task(status, node="n2")) == []  # moved meanwhile: nothing


def test_a_task_listed_by_a_node_other_than_its_own_is_a_stray_there() -> None:
    c = Confirmations(after_s=30.0)
    placed = [("t1", "n2", S.RUNNING), ("t2", "", S.SCHEDULED), ("t3", "n1", S.RUNNING)]
    c.confirm("n1", ["t1", "t2", "t3"], now=10.0)
    # t1 runs on n2 now: n1's copy is a stray; t2 is not placed yet (it may come back to
    # n1); t3 is n1's own.
    assert c.strays(placed, now=12.0, within_s=5.0) == [("t1", "n1")]
    assert c.strays(placed, now=20.0, within_s=5.0) == []  # not listed lately
