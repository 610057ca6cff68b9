"""Reason codes, table-driven: every producer sets its code; legacy text maps to a code once."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from libs.domain.catalog import PAYLOAD_TYPES, parse_payload
from libs.domain.group.events import GroupRecovery, GroupStatusChanged
from libs.domain.node.events import NodeOffline
from libs.domain.payload import Payload, ReasonedPayload
from libs.domain.protocol import AgentReport, Fact, decide_report
from libs.domain.reasons import (
    PLACEMENT_REASONS,
    REASON_SCHEMA_VERSION,
    TEXT,
    ReasonCode,
    legacy_reason_code,
)
from libs.domain.task import decide as commands
from libs.domain.task.events import TaskPendingReason, TaskStatusChanged
from libs.domain.task.evolve import evolve_task
from libs.domain.task.model import Task, TaskId, TaskSpec, TenantId
from libs.domain.task.states import Actor, TaskStatus
from services.retry_engine.decide import Evidence, RetryConfig, decide_retry
from services.scheduler.controllers.groups import _fail as group_fail
from services.scheduler.controllers.groups import is_infra_failure
from services.scheduler.controllers.node_monitor import migrate_decision
from services.scheduler.controllers.placement import _place, _preempt
from services.scheduler.placement.reasons import Reason

R = ReasonCode
S = TaskStatus
AT = datetime(2026, 1, 1, tzinfo=UTC)


def task(status: TaskStatus, **kw: Any) -> Task:
    return Task(
        id=TaskId("t1"),
        tenant_id=TenantId("a"),
        status=status,
        node_id=kw.pop("node_id", "n1"),
        spec=TaskSpec(name="t", image="busybox", max_retries=3),
        created_at=AT,
        updated_at=AT,
        **kw,
    )


def report(fact: Fact, expected: TaskStatus, **kw: Any) -> Callable[[Task], Sequence[Payload]]:
    rep = AgentReport(
        node_id="n1", task_id="t1", attempt=0, fact=fact, expected_status=expected, at=AT, **kw
    )
    return lambda t: decide_report(t, rep)


def retry(t: Task) -> list[Payload]:
    evidence = Evidence(
        exit_code=1, oom_killed=False, error_kind="", error="", output="", failed_at=AT
    )
    return decide_retry(t, evidence, RetryConfig(), {})


PRODUCERS: list[tuple[str, TaskStatus, Callable[[Task], Sequence[Payload]], ReasonCode]] = [
    ("placement", S.PENDING, _place("n1", ("g0",), ""), R.PLACED),
    ("preemption", S.RUNNING, _preempt("t9"), R.PREEMPTED),
    ("node lost", S.RUNNING, migrate_decision("n1"), R.NODE_LOST),
    ("node lost ends stopping", S.STOPPING, migrate_decision("n1"), R.NODE_LOST),
    ("retry", S.FAILED, retry, R.RETRY),
    ("group failed, placed member", S.RUNNING, group_fail, R.GROUP_FAILED),
    ("group failed, pending member", S.PENDING, group_fail, R.GROUP_FAILED),
    ("user stop", S.RUNNING, lambda t: commands.decide_stop(t, Actor.TENANT), R.USER_STOP),
    ("user cancel", S.PENDING, lambda t: commands.decide_stop(t, Actor.TENANT), R.USER_STOP),
    ("user sleep", S.RUNNING, lambda t: commands.decide_sleep(t, Actor.TENANT), R.USER_SLEEP),
    ("user delete", S.RUNNING, lambda t: commands.decide_delete(t, Actor.TENANT), R.USER_DELETE),
    ("agent started", S.SCHEDULED, report(Fact.STARTING, S.SCHEDULED), R.STARTED),
    ("agent resumed", S.WAKING, report(Fact.RESUMED, S.WAKING), R.RESUMED),
    ("agent exit", S.RUNNING, report(Fact.EXITED, S.RUNNING, exit_code=3), R.EXITED),
    (
        "agent start failed",
        S.SCHEDULED,
        report(Fact.START_FAILED, S.SCHEDULED, error_kind="ImageNotFound"),
        R.START_FAILED,
    ),
    ("agent lost container", S.RUNNING, report(Fact.LOST, S.RUNNING), R.CONTAINER_LOST),
    (
        "agent timeout",
        S.RUNNING,
        report(Fact.EXITED, S.RUNNING, exit_code=137, error_kind="Timeout"),
        R.TIMEOUT,
    ),
    ("exit after preemption", S.PREEMPTING, report(Fact.EXITED, S.PREEMPTING), R.PREEMPTED),
]


@pytest.mark.parametrize(
    ("status", "produce", "code"), [p[1:] for p in PRODUCERS], ids=[p[0] for p in PRODUCERS]
)
def test_producer_sets_the_code(
    status: TaskStatus, produce: Callable[[Task], Sequence[Payload]], code: ReasonCode
) -> None:
    changes = [e for e in produce(task(status)) if isinstance(e, TaskStatusChanged)]
    assert changes and all(e.reason_code is code for e in changes)
    assert all(e.reason for e in changes), "people get a text too"
    assert all(e.schema_version == REASON_SCHEMA_VERSION for e in changes)


LEGACY: list[tuple[str, str, dict[str, Any], ReasonCode]] = [
    ("placed", "task_status_changed", {"reason": "placed"}, R.PLACED),
    ("preempted", "task_status_changed", {"reason": "preempted by t9"}, R.PREEMPTED),
    ("node lost", "task_status_changed", {"reason": "node_lost: n1"}, R.NODE_LOST),
    (
        "wake on offline host",
        "task_status_changed",
        {"reason": "wake: host offline"},
        R.HOST_OFFLINE_ON_WAKE,
    ),
    ("wake", "task_status_changed", {"reason": "wake requested"}, R.USER_WAKE),
    ("group wake", "task_status_changed", {"reason": "group wake"}, R.USER_WAKE),
    ("stop", "task_status_changed", {"reason": "stop requested"}, R.USER_STOP),
    ("sleep", "task_status_changed", {"reason": "sleep requested"}, R.USER_SLEEP),
    ("delete", "task_status_changed", {"reason": "deleted"}, R.USER_DELETE),
    ("group failed", "task_status_changed", {"reason": "group failed"}, R.GROUP_FAILED),
    ("reported", "task_status_changed", {"reason": "reported"}, R.REPORTED),
    (
        "retry",
        "task_status_changed",
        {"reason": "exit code 1: retry_new_node; retry 1/3", "from_status": "failed"},
        R.RETRY,
    ),
    ("agent start", "task_status_changed", {"reason": "agent: running"}, R.STARTED),
    ("agent exit", "task_status_changed", {"reason": "agent: exited"}, R.EXITED),
    ("agent lost", "task_status_changed", {"reason": "agent: lost"}, R.CONTAINER_LOST),
    (
        "agent timeout",
        "task_status_changed",
        {"reason": "agent: exited", "error_kind": "Timeout"},
        R.TIMEOUT,
    ),
    (
        "agent requeue",
        "task_status_changed",
        {"reason": "agent: exited", "from_status": "preempting", "to_status": "pending"},
        R.PREEMPTED,
    ),
    ("unknown text", "task_status_changed", {"reason": "something else"}, R.UNSPECIFIED),
    (
        "why pending",
        "task_pending_reason",
        {"reason": "insufficient_gpus: 0 of 2 free"},
        R.INSUFFICIENT_GPUS,
    ),
    ("why pending, unknown", "task_pending_reason", {"reason": "busy: x"}, R.UNSPECIFIED),
    (
        "group member failed",
        "group_status_changed",
        {"reason": "member rank 1 failed: exit code 3"},
        R.MEMBER_FAILED,
    ),
    (
        "group rebuilds used",
        "group_status_changed",
        {"reason": "no live replica and 5 rebuilds used"},
        R.REBUILDS_EXHAUSTED,
    ),
    ("group members", "group_status_changed", {"reason": "members are running"}, R.MEMBERS_CHANGED),
    ("group restart", "group_recovery", {"kind": "group_restart"}, R.GROUP_RESTART),
    ("restart scheduled", "group_recovery", {"kind": "restart_scheduled"}, R.GROUP_RESTART),
    ("rebuild", "group_recovery", {"kind": "inference_rebuild"}, R.GROUP_REBUILD),
    ("replica", "group_recovery", {"kind": "replica_replaced"}, R.MEMBER_FAILED),
    ("node offline", "node_offline", {"silent_seconds": 11.0}, R.NODE_LOST),
    ("node gone", "node_offline", {"silent_seconds": 700.0, "gone": True}, R.NODE_GONE),
]


@pytest.mark.parametrize(
    ("event_type", "payload", "code"), [c[1:] for c in LEGACY], ids=[c[0] for c in LEGACY]
)
def test_legacy_text_maps_to_a_code(
    event_type: str, payload: dict[str, Any], code: ReasonCode
) -> None:
    assert legacy_reason_code(event_type, {"to_status": "pending"} | payload) is code


V1: list[tuple[str, dict[str, Any], ReasonCode]] = [
    (
        "task_status_changed",
        {
            "task_id": "t1",
            "from_status": "sleeping",
            "to_status": "pending",
            "actor": "tenant",
            "reason": "wake: host offline",
            "clear_placement": True,
        },
        R.HOST_OFFLINE_ON_WAKE,
    ),
    ("task_pending_reason", {"task_id": "t1", "reason": "no_nodes: none"}, R.NO_NODES),
    (
        "group_status_changed",
        {
            "group_id": "g",
            "from_status": "running",
            "to_status": "failed",
            "reason": "member rank 0 failed: x",
        },
        R.MEMBER_FAILED,
    ),
    (
        "group_recovery",
        {"group_id": "g", "kind": "inference_rebuild", "reason": "no live replica", "ranks": [0]},
        R.GROUP_REBUILD,
    ),
    ("node_offline", {"node_id": "n1", "silent_seconds": 12.0, "gone": False}, R.NODE_LOST),
]


@pytest.mark.parametrize(("event_type", "stored", "code"), V1, ids=[v[0] for v in V1])
def test_stored_version_1_payloads_still_load(
    event_type: str, stored: dict[str, Any], code: ReasonCode
) -> None:
    payload = parse_payload(event_type, stored | {"schema_version": 1})
    assert isinstance(payload, ReasonedPayload) and payload.reason_code is code
    # The replay's fast path parses the stored JSON text directly: same upcast.
    text = json.dumps(stored | {"schema_version": 1})
    assert PAYLOAD_TYPES[event_type].model_validate_json(text) == payload
    assert payload.schema_version == REASON_SCHEMA_VERSION
    again = parse_payload(event_type, payload.model_dump(mode="json"))
    assert again == payload, "a version-2 payload round-trips unchanged"


@pytest.mark.parametrize(
    ("cls", "fields"),
    [
        (
            TaskStatusChanged,
            {"task_id": "t1", "from_status": "running", "to_status": "failed", "actor": "x"},
        ),
        (TaskPendingReason, {"task_id": "t1", "reason": "no_nodes: none"}),
        (GroupStatusChanged, {"group_id": "g", "from_status": "running", "to_status": "failed"}),
        (GroupRecovery, {"group_id": "g", "kind": "group_restart", "reason": "r"}),
        (NodeOffline, {"node_id": "n1", "silent_seconds": 12.0}),
    ],
    ids=["task", "pending", "group", "recovery", "node"],
)
def test_a_producer_without_a_code_is_refused(cls: type[Payload], fields: dict[str, Any]) -> None:
    # No schema_version in the data: a new payload, which must name its code.
    with pytest.raises(ValidationError, match="reason_code"):
        cls.model_validate(fields)


def test_every_code_has_text_for_people() -> None:
    assert set(TEXT) == set(ReasonCode) and all(TEXT.values())


def test_why_pending_is_the_same_enum() -> None:
    assert Reason is ReasonCode
    assert all(isinstance(r, ReasonCode) for r in PLACEMENT_REASONS)


def test_the_task_shows_the_codes() -> None:
    t = task(S.PENDING, node_id=None)
    (why,) = commands.decide_pending_reason(t, R.NO_NODES, "no_nodes: none registered")
    t = evolve_task(t, why, AT, 2)
    assert (t.pending_reason_code, t.pending_reason) == (R.NO_NODES, "no_nodes: none registered")
    assert commands.decide_pending_reason(t, R.NO_NODES, "no_nodes: none registered") == []
    (placed,) = _place("n1", ("g0",), "")(t)
    t = evolve_task(t, placed, AT, 3)
    assert t.status_reason_code is R.PLACED and t.pending_reason_code is None


@pytest.mark.parametrize(
    ("code", "infra"),
    [(R.CONTAINER_LOST, True), (R.NODE_LOST, True), (R.EXITED, False)],
    ids=["container lost", "node lost", "exit"],
)
def test_group_controller_reads_the_code(code: ReasonCode, infra: bool) -> None:
    # Misleading text on purpose: only the code decides.
    t = task(S.FAILED, status_reason_code=code, error="exit code 3", exit_code=3)
    assert is_infra_failure(t) is infra
