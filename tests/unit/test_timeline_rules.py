"""Timeline rules: which committed events become entries, table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from services.event_timeline.rules import entries_for


def env(stream_type: str, type_: str, **payload: Any) -> dict[str, Any]:
    return {
        "event_id": "e1",
        "stream_type": stream_type,
        "type": type_,
        "occurred_at": "2026-01-01T00:00:00+00:00",
        "payload": payload,
    }


def status(src: str, to: str, reason: str = "", **kw: Any) -> dict[str, Any]:
    return env(
        "task",
        "task_status_changed",
        task_id="t1",
        from_status=src,
        to_status=to,
        reason=reason,
        **kw,
    )


CASES = [
    (
        "node lost migration",
        status("running", "pending", "node_lost: n1"),
        [("task", "node_lost_migration")],
    ),
    (
        "node lost ends stopping",
        status("stopping", "stopped", "node_lost: n1"),
        [("task", "node_lost_ended")],
    ),
    ("preemption", status("running", "preempting", "preempted by t9"), [("task", "preemption")]),
    (
        "requeue after preemption",
        status("preempting", "pending", "agent: exited"),
        [("task", "preempted_requeue")],
    ),
    (
        "wake on offline host",
        status("sleeping", "pending", "wake: host offline"),
        [("task", "wake_rescheduled")],
    ),
    (
        "container lost",
        status("running", "failed", error="ContainerLost: gone"),
        [("task", "container_lost")],
    ),
    (
        "timeout",
        status("running", "failed", error="task exceeded its timeout", error_kind="Timeout"),
        [("task", "task_timeout")],
    ),
    (
        "retry escalation",
        env(
            "task",
            "task_retry_decided",
            task_id="t1",
            attempt=0,
            action="retry",
            reason="OOM: doubled",
            failure_class="cpu_oom",
        ),
        [("task", "retry_escalation")],
    ),
    (
        "retry given up",
        env(
            "task",
            "task_retry_decided",
            task_id="t1",
            attempt=3,
            action="give_up",
            reason="exhausted",
            failure_class="other",
        ),
        [("task", "retry_given_up")],
    ),
    (
        "gpu lost",
        env("node", "gpu_lost", node_id="n1", gpu_id="g0", missed_heartbeats=3),
        [("node", "gpu_lost")],
    ),
    (
        "gpu recovered",
        env("node", "gpu_recovered", node_id="n1", gpu_id="g0", seen_heartbeats=2),
        [("node", "gpu_recovered")],
    ),
    (
        "node offline",
        env("node", "node_offline", node_id="n1", silent_seconds=11.0),
        [("node", "node_offline")],
    ),
    (
        "group restart",
        env("group", "group_recovery", group_id="g", kind="group_restart", reason="r"),
        [("group", "group_restart")],
    ),
    (
        "inference rebuild",
        env("group", "group_recovery", group_id="g", kind="inference_rebuild", reason="r"),
        [("group", "inference_rebuild")],
    ),
    (
        "replica self-heal",
        env("group", "group_recovery", group_id="g", kind="replica_replaced", reason="r"),
        [("group", "replica_self_heal")],
    ),
    (
        "group failed",
        env(
            "group",
            "group_status_changed",
            group_id="g",
            from_status="running",
            to_status="failed",
            reason="r",
        ),
        [("group", "group_failed")],
    ),
    # Not fault-tolerance transitions: nothing is invented.
    ("ordinary completion", status("running", "completed", "agent: exited"), []),
    ("placement", status("pending", "scheduled", "placed"), []),
    ("user stop", status("running", "stopping", "stop requested"), []),
    (
        "retry hold",
        env(
            "task",
            "task_retry_decided",
            task_id="t1",
            attempt=0,
            action="hold",
            reason="group",
            failure_class="other",
        ),
        [],
    ),
    (
        "group running",
        env(
            "group",
            "group_status_changed",
            group_id="g",
            from_status="pending",
            to_status="running",
            reason="r",
        ),
        [],
    ),
    ("task created", env("task", "task_created", task_id="t1"), []),
]


@pytest.mark.parametrize(
    ("envelope", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_rule(envelope: dict[str, Any], expected: list[tuple[str, str]]) -> None:
    entries = entries_for(envelope)
    assert [(e.subject_type, e.kind) for e in entries] == expected
    for e in entries:
        assert e.id.startswith("e1:") and e.message
