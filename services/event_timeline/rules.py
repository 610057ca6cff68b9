"""Which committed events are real fault-tolerance transitions, and how they read (pure).

One rule per kind. An event that is not such a transition yields nothing: the timeline never
invents entries. Entry ids derive from the source event id, so a redelivered event maps to
the same ids and adds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


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
    "container_lost",
    "preemption",
    "preempted_requeue",
    "retry_escalation",
    "retry_given_up",
    "task_timeout",
    "wake_rescheduled",
    "gpu_lost",
    "gpu_recovered",
    "node_offline",
    "group_failed",
    "group_restart_scheduled",
    "group_restart",
    "inference_rebuild",
    "replica_self_heal",
)


def _entry(
    env: dict[str, Any], subject_type: str, subject_id: str, kind: str, message: str, **details: Any
) -> Entry:
    return Entry(
        id=f"{env['event_id']}:{subject_type}:{subject_id}",
        subject_type=subject_type,
        subject_id=subject_id,
        kind=kind,
        message=message,
        occurred_at=datetime.fromisoformat(env["occurred_at"]),
        source_event=env["event_id"],
        details=details,
    )


def task_entries(env: dict[str, Any]) -> list[Entry]:
    p = env["payload"]
    tid, src, to = p.get("task_id", ""), p.get("from_status"), p.get("to_status")
    reason, error = p.get("reason") or "", p.get("error") or ""
    if env["type"] == "task_retry_decided":
        kind = {"retry": "retry_escalation", "give_up": "retry_given_up"}.get(p["action"])
        if kind is None:
            return []
        return [
            _entry(
                env,
                "task",
                tid,
                kind,
                p["reason"],
                attempt=p["attempt"],
                failure_class=p["failure_class"],
                node_id=p.get("node_id"),
                memory_mb=p.get("memory_mb"),
                delay_s=p.get("delay_s"),
            )
        ]
    if env["type"] != "task_status_changed":
        return []
    if reason.startswith("node_lost"):
        if to == "pending":
            return [
                _entry(
                    env,
                    "task",
                    tid,
                    "node_lost_migration",
                    f"{reason}: {src} → pending, to be placed on another node",
                    from_status=src,
                )
            ]
        return [
            _entry(
                env,
                "task",
                tid,
                "node_lost_ended",
                f"{reason}: {src} → {to} in place",
                from_status=src,
                to_status=to,
            )
        ]
    if to == "preempting":
        return [_entry(env, "task", tid, "preemption", reason, from_status=src)]
    if src == "preempting" and to == "pending":
        return [_entry(env, "task", tid, "preempted_requeue", "preempted: back to pending")]
    if to == "pending" and reason == "wake: host offline":
        return [
            _entry(
                env,
                "task",
                tid,
                "wake_rescheduled",
                "woken while its host was offline: rescheduled elsewhere",
            )
        ]
    if to == "failed" and error.startswith("ContainerLost"):
        return [_entry(env, "task", tid, "container_lost", error)]
    if to == "failed" and p.get("error_kind") == "Timeout":
        return [_entry(env, "task", tid, "task_timeout", error)]
    return []


def node_entries(env: dict[str, Any]) -> list[Entry]:
    p = env["payload"]
    node = p.get("node_id", "")
    if env["type"] == "node_offline":
        state = "gone for good" if p.get("gone") else "offline"
        return [
            _entry(
                env,
                "node",
                node,
                "node_offline",
                f"node {node} {state} after {p['silent_seconds']:.0f}s of silence",
            )
        ]
    if env["type"] in ("gpu_lost", "gpu_recovered"):
        verb = "lost" if env["type"] == "gpu_lost" else "recovered"
        return [
            _entry(
                env,
                "node",
                node,
                env["type"],
                f"GPU {p['gpu_id']} {verb} on {node}",
                gpu_id=p["gpu_id"],
            )
        ]
    return []


GROUP_KINDS = {
    "restart_scheduled": "group_restart_scheduled",
    "group_restart": "group_restart",
    "inference_rebuild": "inference_rebuild",
    "replica_replaced": "replica_self_heal",
}


def group_entries(env: dict[str, Any]) -> list[Entry]:
    p = env["payload"]
    gid = p.get("group_id", "")
    if env["type"] == "group_recovery":
        return [
            _entry(
                env,
                "group",
                gid,
                GROUP_KINDS[p["kind"]],
                p["reason"],
                ranks=p.get("ranks", []),
                replaced=p.get("task_ids", []),
            )
        ]
    if env["type"] == "group_status_changed" and p["to_status"] == "failed":
        return [_entry(env, "group", gid, "group_failed", p["reason"])]
    return []


def entries_for(env: dict[str, Any]) -> list[Entry]:
    rule = {"task": task_entries, "node": node_entries, "group": group_entries}.get(
        env.get("stream_type", "")
    )
    return rule(env) if rule else []
