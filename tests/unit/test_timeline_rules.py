"""Timeline rules: which committed events become entries, table-driven.

Status changes are keyed on their reason code; the legacy cases are version-1 payloads
(text only) as the platform wrote them before codes, mapped once by the domain when the
payload is parsed into its model.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast
from uuid import UUID

import pytest

from libs.bus.typed import payload_type
from libs.domain.catalog import Payload, parse_payload
from libs.domain.envelope import EventEnvelope
from libs.domain.node.events import GpuLost, GpuRecovered
from libs.domain.reasons import ReasonCode
from libs.domain.rollout.model import RolloutRequest
from libs.domain.task.model import TaskSpec
from libs.store.eventstore import EventStore
from services.event_timeline.handlers.events import Timeline
from services.event_timeline.rules import RULES, entries_for

R = ReasonCode
EVENT_ID = UUID("00000000-0000-4000-8000-0000000000e1")
SPEC = TaskSpec(name="srv", image="busybox:latest").model_dump(mode="json")

Event = tuple[EventEnvelope, Payload]


def env(stream_type: str, type_: str, **payload: Any) -> Event:
    """A committed event as the timeline's handlers receive it: envelope and parsed model."""
    envelope = EventEnvelope(
        event_id=EVENT_ID,
        position=1,
        stream_id="s1",
        stream_type=stream_type,
        version=1,
        type=type_,
        occurred_at=datetime(2026, 1, 1, tzinfo=UTC),
        payload=payload,
    )
    return envelope, parse_payload(type_, payload)


def status(src: str, to: str, code: ReasonCode, reason: str = "", **kw: Any) -> Event:
    return env(
        "task",
        "task_status_changed",
        task_id="t1",
        from_status=src,
        to_status=to,
        actor="agent",
        reason_code=code.value,
        reason=reason,
        schema_version=2,
        **kw,
    )


def legacy(src: str, to: str, reason: str, **kw: Any) -> Event:
    """A version-1 status change: text only, no code."""
    return env(
        "task",
        "task_status_changed",
        task_id="t1",
        from_status=src,
        to_status=to,
        actor="agent",
        reason=reason,
        schema_version=1,
        **kw,
    )


def recovery(kind: str) -> Event:
    """A version-1 group recovery: its code comes from its kind."""
    return env("group", "group_recovery", group_id="g", kind=kind, reason="r", schema_version=1)


def retry(action: str, attempt: int, reason: str, failure_class: str) -> Event:
    return env(
        "task",
        "task_retry_decided",
        task_id="t1",
        attempt=attempt,
        node_id="n1",
        action=action,
        reason=reason,
        failure_class=failure_class,
        failure_kind="x",
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
        retry("retry", 0, "OOM: doubled", "cpu_oom"),
        [("task", "retry_escalation")],
    ),
    (
        "retry given up",
        retry("give_up", 3, "exhausted", "other"),
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
        "card quarantined after a task's device fault",
        env(
            "node",
            "card_quarantined",
            node_id="n1",
            gpu_id="g0",
            code="xid:79",
            evidence="NVML XID event 79 (XID 79: GPU has fallen off the bus)",
            task_id="t1",
        ),
        [("node", "card_quarantined"), ("task", "card_quarantined")],
    ),
    (
        "card quarantined by an operator",
        env(
            "node",
            "card_quarantined",
            node_id="n1",
            gpu_id="g0",
            code="manual",
            evidence="fan noise",
            by="operator",
        ),
        [("node", "card_quarantined")],
    ),
    (
        "card restored",
        env("node", "card_restored", node_id="n1", gpu_id="g0", by="probe", probes_passed=3),
        [("node", "card_restored")],
    ),
    (
        "device requeue",
        retry("requeue", 0, "device fault on g0 (xid:79)", "device_fatal"),
        [("task", "device_requeue")],
    ),
    (
        "node offline",
        env("node", "node_offline", node_id="n1", silent_seconds=11.0, schema_version=1),
        [("node", "node_offline")],
    ),
    (
        "group restart",
        recovery("group_restart"),
        [("group", "group_restart")],
    ),
    (
        "inference rebuild",
        recovery("inference_rebuild"),
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
        recovery("replica_replaced"),
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
            reason_code="member_failed",
        ),
        [("group", "group_failed")],
    ),
    (
        "rollout started",
        env(
            "group",
            "rollout_started",
            group_id="g",
            rollout_id="ro-1",
            generation=1,
            request=RolloutRequest(image="busybox:1").model_dump(mode="json"),
            previous=SPEC,
            target=SPEC,
        ),
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
    # Card lending between a sleeping inference task and a training task of its tenant.
    (
        "sleep measured",
        env(
            "task",
            "task_sleep_measured",
            task_id="t1",
            node_id="n1",
            sleep_mode="engine",
            vram_before_mb=20000.0,
            vram_after_mb=900.0,
            released_fraction=0.95,
            min_released_fraction=0.9,
            released=True,
        ),
        [("task", "sleep_measured")],
    ),
    (
        "card lent",
        env(
            "task",
            "task_card_lent",
            task_id="t1",
            borrower_task_id="t2",
            node_id="n1",
            gpu_ids=["g0"],
        ),
        [("task", "card_lent")],
    ),
    (
        "card borrowed",
        env(
            "task",
            "task_card_borrowed",
            task_id="t2",
            lender_task_id="t1",
            node_id="n1",
            gpu_ids=["g0"],
        ),
        [("task", "card_borrowed")],
    ),
    (
        "wake queued",
        env("task", "task_wake_queued", task_id="t1", borrower_task_id="t2", actor="tenant"),
        [("task", "wake_queued")],
    ),
    (
        "card returned",
        env(
            "task",
            "task_card_returned",
            task_id="t1",
            borrower_task_id="t2",
            borrower_status="completed",
            wake=True,
        ),
        [("task", "card_returned")],
    ),
    # Not fault-tolerance transitions: nothing is invented.
    ("ordinary completion", status("running", "completed", R.EXITED), []),
    ("placement", status("pending", "scheduled", R.PLACED), []),
    ("user stop", status("running", "stopping", R.USER_STOP), []),
    ("failure by exit", status("running", "failed", R.EXITED, error="exit code 3"), []),
    (
        "retry hold",
        retry("hold", 0, "group", "other"),
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
            reason_code="members_changed",
        ),
        [],
    ),
    (
        "task created",
        env("task", "task_created", task_id="t1", tenant_id="ten", spec=SPEC),
        [],
    ),
]


@pytest.mark.parametrize(
    ("envelope", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_rule(envelope: Event, expected: list[tuple[str, str]]) -> None:
    entries = entries_for(*envelope)
    assert [(e.subject_type, e.kind) for e in entries] == expected
    for e in entries:
        assert e.id.startswith(f"{EVENT_ID}:") and e.message
        assert e.source_event == str(EVENT_ID) and e.occurred_at == envelope[0].occurred_at
        assert e.details["reason_code"] in set(ReasonCode)


@pytest.mark.parametrize(
    ("envelope", "code"),
    [
        (status("running", "pending", R.NODE_LOST), R.NODE_LOST),
        (legacy("sleeping", "pending", "wake: host offline"), R.HOST_OFFLINE_ON_WAKE),
        (env("node", "gpu_lost", node_id="n1", gpu_id="g0", missed_heartbeats=3), R.GPU_LOST),
        (
            env(
                "node",
                "node_offline",
                node_id="n1",
                silent_seconds=700.0,
                gone=True,
                schema_version=1,
            ),
            R.NODE_GONE,
        ),
        (
            recovery("group_restart"),
            R.GROUP_RESTART,
        ),
    ],
    ids=["task", "legacy task", "gpu", "legacy node gone", "legacy group"],
)
def test_entries_carry_the_reason_code(envelope: Event, code: ReasonCode) -> None:
    (entry,) = entries_for(*envelope)
    assert entry.details["reason_code"] == code.value


def test_every_rule_has_a_case_that_makes_an_entry() -> None:
    covered = {type(ev) for (_, ev), expected in (c[1:] for c in CASES) if expected}
    assert set(RULES) - covered == set()


def _plain(value: Any) -> bool:
    if isinstance(value, dict):
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return type(value) in (str, int, float, bool, type(None))


@pytest.mark.parametrize(
    "envelope", [c[1] for c in CASES if c[2]], ids=[c[0] for c in CASES if c[2]]
)
def test_details_are_plain_json(envelope: Event) -> None:
    """Models carry tuples and enums; the stored details stay what the API returns."""
    for e in entries_for(*envelope):
        assert _plain(e.details), e.details


def test_the_timeline_consumer_takes_every_rules_type() -> None:
    timeline = Timeline(cast(EventStore, None), timedelta(days=1), cap=10)
    assert timeline.handlers.types == {model.type for model in RULES}
    for handler in timeline.handlers.handlers():
        assert payload_type(handler) in RULES or payload_type(handler) in (GpuLost, GpuRecovered)
