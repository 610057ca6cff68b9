"""The retry decision chain, table-driven, no servers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast
from uuid import UUID

import pytest

from libs.domain.envelope import EventEnvelope
from libs.domain.reasons import ReasonCode
from libs.domain.task.events import TaskRetryDecided, TaskStatusChanged
from libs.domain.task.model import Task, TaskId, TaskSpec, TenantId
from libs.domain.task.states import TaskStatus
from libs.store.eventstore import EventStore
from services.retry_engine.decide import (
    Evidence,
    NodeFacts,
    RetryConfig,
    backoff_delay,
    decide_retry,
)
from services.retry_engine.handlers.failures import RetryEngine, evidence_of

AT = datetime(2026, 1, 1, tzinfo=UTC)
CFG = RetryConfig(retry_delay_s=30, backoff_multiplier=2, oom_memory_limit_mb=16384)
NODES = {
    "small": NodeFacts(True, 65536, 8192, {"g-small": 8192}),
    "big": NodeFacts(True, 65536, 24576, {"g-big": 24576}),
}


def failed(**kw: Any) -> Task:
    spec = TaskSpec.model_validate({"name": "t", "image": "x"} | kw.pop("spec", {}))
    return Task(
        id=TaskId("t"),
        tenant_id=TenantId("a"),
        spec=spec,
        status=TaskStatus.FAILED,
        node_id=kw.pop("node_id", "small"),
        gpu_ids=kw.pop("gpu_ids", ("g-small",)),
        created_at=AT,
        updated_at=AT,
        **kw,
    )


def ev(**kw: Any) -> Evidence:
    base: dict[str, Any] = dict(
        exit_code=1, oom_killed=False, error_kind="", error="", output="", failed_at=AT
    )
    return Evidence(**(base | kw))


def run(
    task: Task, evidence: Evidence, nodes: dict[str, NodeFacts] = NODES
) -> tuple[TaskRetryDecided, TaskStatusChanged | None]:
    events = decide_retry(task, evidence, CFG, nodes)
    decided = events[0]
    assert isinstance(decided, TaskRetryDecided)
    move = events[1] if len(events) > 1 else None
    assert move is None or isinstance(move, TaskStatusChanged)
    return decided, move


CASES = [
    ("permanent", failed(), ev(error_kind="ImageNotFound"), "give_up", {}),
    ("exhausted", failed(retry_count=3), ev(), "give_up", {}),
    ("no_retry", failed(spec={"retry_strategy": "no_retry"}), ev(), "give_up", {}),
    (
        "cpu oom doubles, same node",
        failed(spec={"memory_mb": 4096}),
        ev(oom_killed=True),
        "retry",
        {"memory_mb": 8192, "same_node_id": "small"},
    ),
    ("cpu oom past cap", failed(spec={"memory_mb": 16384}), ev(oom_killed=True), "give_up", {}),
    (
        "task cap override",
        failed(spec={"memory_mb": 512, "oom_memory_limit": 800}),
        ev(oom_killed=True),
        "give_up",
        {},
    ),
    ("gpu oom moves up", failed(), ev(output="CUDA out of memory"), "retry", {"min_vram_mb": 8193}),
    (
        "gpu oom on the biggest",
        failed(node_id="big", gpu_ids=("g-big",)),
        ev(output="CUDA out of memory"),
        "give_up",
        {},
    ),
    (
        "transient same node",
        failed(),
        ev(error_kind="NetworkTimeout"),
        "retry",
        {"same_node_id": "small"},
    ),
    ("other, new node", failed(), ev(exit_code=3), "retry", {"avoid_node_ids": ("small",)}),
    (
        "other, same node strategy",
        failed(spec={"retry_strategy": "retry_same_node"}),
        ev(exit_code=3),
        "retry",
        {"same_node_id": "small"},
    ),
    ("static world", failed(group_id="g", spec={"task_type": "training"}), ev(), "hold", {}),
    ("replica member", failed(group_id="g"), ev(exit_code=137), "hold", {}),
]


@pytest.mark.parametrize(
    ("task", "evidence", "action", "expect"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_decision(task: Task, evidence: Evidence, action: str, expect: dict[str, Any]) -> None:
    decided, move = run(task, evidence)
    assert decided.action == action and decided.reason
    if action != "retry":
        assert move is None
        return
    assert move is not None and move.to_status is TaskStatus.PENDING
    assert move.retry_count == task.retry_count + 1 and move.clear_placement
    for key, value in expect.items():
        assert getattr(move, key) == value, key


def test_new_node_falls_back_when_alone() -> None:
    _, move = run(failed(), ev(exit_code=3), {"small": NODES["small"]})
    assert move is not None and move.avoid_node_ids is None


@pytest.mark.parametrize(("retry_count", "delay"), [(0, 30), (1, 60), (2, 120)])
def test_backoff(retry_count: int, delay: float) -> None:
    task = failed(retry_count=retry_count, spec={"max_retries": 5})
    assert backoff_delay(task, CFG) == delay
    _, move = run(task, ev(exit_code=1))
    assert move is not None and move.not_before == AT + timedelta(seconds=delay)


def test_per_task_backoff_override() -> None:
    task = failed(retry_count=2, spec={"retry_delay": 1, "backoff_multiplier": 3, "max_retries": 5})
    assert backoff_delay(task, CFG) == 9


def test_not_failed_is_a_no_op() -> None:
    task = failed().model_copy(update={"status": TaskStatus.PENDING})
    assert decide_retry(task, ev(), CFG, NODES) == []


def test_the_failure_event_is_the_evidence() -> None:
    failure = TaskStatusChanged(
        task_id=TaskId("t"),
        from_status=TaskStatus.RUNNING,
        to_status=TaskStatus.FAILED,
        actor="agent",
        reason_code=ReasonCode.EXITED,
        exit_code=137,
        oom_killed=True,
        error_kind="OOMKilled",
        error="killed",
        result="tail of the output",
    )
    envelope = EventEnvelope(
        event_id=UUID(int=1),
        position=1,
        stream_id="t",
        stream_type="task",
        version=3,
        type=failure.type,
        occurred_at=AT,
        payload=failure.model_dump(mode="json"),
    )
    assert evidence_of(envelope, failure) == Evidence(
        exit_code=137,
        oom_killed=True,
        error_kind="OOMKilled",
        error="killed",
        output="tail of the output",
        failed_at=AT,
    )
    bare = failure.model_copy(
        update={"oom_killed": None, "error_kind": None, "error": None, "result": None}
    )
    assert evidence_of(envelope, bare) == ev(exit_code=137)


def test_the_engine_takes_status_changes_only() -> None:
    engine = RetryEngine(cast(EventStore, None), CFG)
    assert engine.handlers.types == {TaskStatusChanged.type}
