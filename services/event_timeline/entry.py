"""A timeline entry: one fault-tolerance transition of a task, group or node, as stored.

Its id derives from the source event's id and its subject, so a redelivered event maps to
the same ids and adds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from libs.domain.envelope import EventEnvelope


@dataclass(frozen=True)
class Entry:
    id: str
    subject_type: str  # task | group | node
    subject_id: str
    kind: str
    message: str
    occurred_at: datetime
    source_event: str
    details: dict[str, Any] = field(default_factory=dict)


KINDS = (
    "node_lost_migration",
    "node_lost_ended",
    "task_unconfirmed",
    "container_lost",
    "preemption",
    "preempted_requeue",
    "retry_escalation",
    "retry_given_up",
    "task_timeout",
    "wake_rescheduled",
    "gpu_lost",
    "gpu_recovered",
    "card_quarantined",
    "card_restored",
    "device_requeue",
    "node_offline",
    "group_failed",
    "group_restart_scheduled",
    "group_restart",
    "inference_rebuild",
    "replica_self_heal",
    "idle_sleep",
    "request_wake",
    "sleep_measured",
    "card_lent",
    "card_borrowed",
    "wake_queued",
    "card_returned",
    "wake_completed",
    "liveness_lost",
    "rollout_started",
    "rollout_batch",
    "rollout_drain",
    "rollout_rollback",
    "rollout_completed",
    "rollout_failed",
    "rollout_rolled_back",
    "variant_placed",
)


def entry(
    env: EventEnvelope,
    subject_type: str,
    subject_id: str,
    kind: str,
    message: str,
    **details: Any,
) -> Entry:
    return Entry(
        id=f"{env.event_id}:{subject_type}:{subject_id}",
        subject_type=subject_type,
        subject_id=subject_id,
        kind=kind,
        message=message,
        occurred_at=env.occurred_at,
        source_event=str(env.event_id),
        details=details,
    )
