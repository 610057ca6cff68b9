"""Timeline rules: which committed events become entries, table-driven.

Status changes are keyed on their reason code; the legacy cases are version-1 payloads
(text only) as the platform wrote them before codes, mapped once by the domain.
"""

from __future__ import annotations

from typing import Any

import pytest

from libs.domain.reasons import ReasonCode
from services.event_timeline.rules import entries_for

R = ReasonCode


def env(stream_type: str, type_: str, **payload: Any) -> dict[str, Any]:
    return {
        "event_id": "e1",
        "stream_type": stream_type,
        "type": type_,
        "occurred_at": "2026-01-01T00:00:00+00:00",
        "payload": payload,
    }


def status(src: str, to: str, code: ReasonCode, reason: str = "", **kw: Any) -> dict[str, Any]:
    return env(
        "task",
        "task_status_changed",
        task_id="t1",
        from_status=src,
        to_status=to,
        reason_code=code.value,
        reason=reason,
        schema_version=2,
        **kw,
    )


def legacy(src: str, to: str, reason: str, **kw: Any) -> dict[str, Any]:
    """A version-1 status change: text only, no code."""
    return env(
        "task",
        "task_status_changed",
        task_id="t1",
        from_status=src,
        to_status=to,
        reason=reason,
        schema_version=1,
        **kw,
    )


CASES = [
    (
        "node lost migration",
        status("running", "pending", R.NODE_LOST, "node n1 stopped answering"),
        [("task", "node_lost_migration")],
    ),
    (
        "node lost ends stopping",
        status("stopping", "stopped", R.NODE_LOST),
        [("task", "node_lost_ended")],
    ),
    (
        "unconfirmed by its node",
        status("running", "pending", R.TASK_UNCONFIRMED),
        [("task", "task_unconfirmed")],
    ),
    ("preemption", status("running", "preempting", R.PREEMPTED), [("task", "preemption")]),
    (
        "requeue after preemption",
        status("preempting", "pending", R.PREEMPTED, "agent: exited"),
        [("task", "preempted_requeue")],
    ),
    (
        "wake on offline host",
        status("sleeping", "pending", R.HOST_OFFLINE_ON_WAKE),
        [("task", "wake_rescheduled")],
    ),
    (
        "container lost",
        status("running", "failed", R.CONTAINER_LOST, error="the container is gone"),
        [("task", "container_lost")],
    ),
    (
        "timeout",
        status("running", "failed", R.TIMEOUT, error="task exceeded its timeout"),
        [("task", "task_timeout")],
    ),
    # The text is for people: a code that is not a fault wins over text that reads like one.
    ("text is not parsed", status("running", "pending", R.RETRY, "node_lost: n1"), []),
    (
        "no error text needed",
        status("running", "failed", R.CONTAINER_LOST),
        [("task", "container_lost")],
    ),
    # Version-1 payloads, mapped to codes once by the domain's legacy mapping.
    (
        "legacy node lost",
        legacy("running", "pending", "node_lost: n1"),
        [("task", "node_lost_migration")],
    ),
    (
        "legacy node lost ends",
        legacy("draining", "cancelled", "node_lost: n1"),
        [("task", "node_lost_ended")],
    ),
    (
        "legacy preemption",
        legacy("running", "preempting", "preempted by t9"),
        [("task", "preemption")],
    ),
    (
        "legacy requeue",
        legacy("preempting", "pending", "agent: exited"),
        [("task", "preempted_requeue")],
    ),
    (
        "legacy wake",
        legacy("sleeping", "pending", "wake: host offline"),
        [("task", "wake_rescheduled")],
    ),
    (
        "legacy container lost",
        legacy("running", "failed", "agent: lost", error="ContainerLost: gone"),
        [("task", "container_lost")],
    ),
    (
        "legacy timeout",
        legacy("running", "failed", "agent: exited", error="x", error_kind="Timeout"),
        [("task", "task_timeout")],
    ),
    ("legacy completion", legacy("running", "completed", "agent: exited"), []),
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
        "group scaled",
        env(
            "group",
            "group_scaled",
            group_id="g",
            source="user",
            from_replicas=2,
            to_replicas=4,
            reason="r",
            reason_code="user_scale",
        ),
        [("group", "group_scaled")],
    ),
    (
        "window action",
        env(
            "group",
            "group_window_applied",
            group_id="g",
            action="pause",
            labels={},
            reason="r",
            reason_code="schedule_window",
        ),
        [("group", "schedule_window")],
    ),
    (
        "window restore",
        env(
            "group",
            "group_window_applied",
            group_id="g",
            action="restore",
            labels={},
            reason="r",
            reason_code="schedule_window",
        ),
        [("group", "schedule_window_restore")],
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
    (
        "rollout started",
        env("group", "rollout_started", group_id="g", rollout_id="ro-1", generation=1),
        [("group", "rollout_started")],
    ),
    *[
        (
            f"rollout batch {step}",
            env(
                "group",
                "rollout_batch_recorded",
                group_id="g",
                rollout_id="ro-1",
                number=1,
                attempt=1,
                step=step,
                ranks=[0],
            ),
            [("group", kind)],
        )
        for step, kind in (
            ("started", "rollout_batch"),
            ("drain", "rollout_drain"),
            ("done", "rollout_batch"),
            ("failed", "rollout_batch"),
            ("restored", "rollout_batch"),
        )
    ],
    *[
        (
            f"rollout {to}",
            env(
                "group",
                "rollout_phase_changed",
                group_id="g",
                rollout_id="ro-1",
                from_phase="running",
                to_phase=to,
                reason="r",
                reason_code="rollout_batch_failed",
            ),
            [("group", kind)] if kind else [],
        )
        for to, kind in (
            ("rollback", "rollout_rollback"),
            ("completed", "rollout_completed"),
            ("failed", "rollout_failed"),
            ("rolled_back", "rollout_rolled_back"),
            ("paused", None),
        )
    ],
    (
        "rollout lease renewed",
        env("group", "rollout_lease_renewed", group_id="g", rollout_id="ro-1", holder="h"),
        [],
    ),
    # Not fault-tolerance transitions: nothing is invented.
    ("ordinary completion", status("running", "completed", R.EXITED), []),
    ("placement", status("pending", "scheduled", R.PLACED), []),
    ("user stop", status("running", "stopping", R.USER_STOP), []),
    ("failure by exit", status("running", "failed", R.EXITED, error="exit code 3"), []),
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
        assert e.details["reason_code"] in set(ReasonCode)


@pytest.mark.parametrize(
    ("envelope", "code"),
    [
        (status("running", "pending", R.NODE_LOST), R.NODE_LOST),
        (legacy("sleeping", "pending", "wake: host offline"), R.HOST_OFFLINE_ON_WAKE),
        (env("node", "gpu_lost", node_id="n1", gpu_id="g0", missed_heartbeats=3), R.GPU_LOST),
        (
            env("node", "node_offline", node_id="n1", silent_seconds=700.0, gone=True),
            R.NODE_GONE,
        ),
        (
            env("group", "group_recovery", group_id="g", kind="group_restart", reason="r"),
            R.GROUP_RESTART,
        ),
    ],
    ids=["task", "legacy task", "gpu", "legacy node gone", "legacy group"],
)
def test_entries_carry_the_reason_code(envelope: dict[str, Any], code: ReasonCode) -> None:
    (entry,) = entries_for(envelope)
    assert entry.details["reason_code"] == code.value
