"""Which committed events are real fault-tolerance transitions, and how they read (pure).

One rule per kind, keyed on event types, statuses and reason codes, never on reason text.
An event that is not such a transition yields nothing: the timeline never invents entries.
Every entry's details carry the reason code, for clients to branch on. Entry ids derive
from the source event id, so a redelivered event maps to the same ids and adds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from libs.domain.reasons import ReasonCode, reason_code_of

R = ReasonCode


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


RETRY_KINDS = {
    "retry": ("retry_escalation", R.RETRY),
    "give_up": ("retry_given_up", R.RETRY_GIVEN_UP),
}


def task_entries(env: dict[str, Any]) -> list[Entry]:
    p = env["payload"]
    tid = p.get("task_id", "")
    if env["type"] == "task_retry_decided":
        kind, code = RETRY_KINDS.get(p["action"], (None, R.UNSPECIFIED))
        if kind is None:
            return []
        return [
            _entry(
                env,
                "task",
                tid,
                kind,
                p["reason"],
                reason_code=code.value,
                attempt=p["attempt"],
                failure_class=p["failure_class"],
                node_id=p.get("node_id"),
                memory_mb=p.get("memory_mb"),
                delay_s=p.get("delay_s"),
            )
        ]
    if env["type"] in LENDING_RULES:
        return [LENDING_RULES[env["type"]](env, p)]
    if env["type"] != "task_status_changed":
        return []
    code = reason_code_of(env["type"], p)
    src, to = p.get("from_status"), p.get("to_status")
    kind = _status_kind(code, to)
    if kind is None:
        return []
    text = p.get("reason") or code.text  # shown, never matched
    message = (
        {
            "node_lost_migration": f"{text}: {src} → pending, to be placed on another node",
            "node_lost_ended": f"{text}: {src} → {to} in place",
            "task_unconfirmed": f"{text}: {src} → {to}",
            "preemption": text,
            "preempted_requeue": "preempted: back to pending",
            "wake_rescheduled": R.HOST_OFFLINE_ON_WAKE.text,
        }.get(kind)
        or p.get("error")
        or text
    )
    details: dict[str, Any] = {"reason_code": code.value}
    if kind in ("node_lost_migration", "node_lost_ended", "task_unconfirmed", "preemption"):
        details["from_status"] = src
    if kind in ("node_lost_ended", "task_unconfirmed"):
        details["to_status"] = to
    return [_entry(env, "task", tid, kind, message, **details)]


def _sleep_measured(env: dict[str, Any], p: dict[str, Any]) -> Entry:
    before, after = p.get("vram_before_mb"), p.get("vram_after_mb")
    figures = f"VRAM {before} → {after} MB" if before is not None else "no VRAM reading"
    verdict = "card lendable" if p["released"] else f"not lendable: {p['why']}"
    return _entry(
        env,
        "task",
        p["task_id"],
        "sleep_measured",
        f"asleep ({p['sleep_mode']}), {figures}: {verdict}",
        reason_code=R.USER_SLEEP.value,
        sleep_mode=p["sleep_mode"],
        vram_before_mb=before,
        vram_after_mb=after,
        released_fraction=p.get("released_fraction"),
        min_released_fraction=p["min_released_fraction"],
        released=p["released"],
    )


def _card_lent(env: dict[str, Any], p: dict[str, Any]) -> Entry:
    cards = ", ".join(p["gpu_ids"])
    return _entry(
        env,
        "task",
        p["task_id"],
        "card_lent",
        f"card {cards} lent to training task {p['borrower_task_id']} while asleep",
        reason_code=R.CARD_BORROWED.value,
        borrower_task_id=p["borrower_task_id"],
        node_id=p["node_id"],
        gpu_ids=list(p["gpu_ids"]),
    )


def _card_borrowed(env: dict[str, Any], p: dict[str, Any]) -> Entry:
    cards = ", ".join(p["gpu_ids"])
    return _entry(
        env,
        "task",
        p["task_id"],
        "card_borrowed",
        f"runs on card {cards} of sleeping task {p['lender_task_id']} (lent)",
        reason_code=R.CARD_BORROWED.value,
        lender_task_id=p["lender_task_id"],
        node_id=p["node_id"],
        gpu_ids=list(p["gpu_ids"]),
    )


def _wake_queued(env: dict[str, Any], p: dict[str, Any]) -> Entry:
    return _entry(
        env,
        "task",
        p["task_id"],
        "wake_queued",
        f"wake queued until {p['borrower_task_id']} gives its card back",
        reason_code=R.WAKE_QUEUED.value,
        borrower_task_id=p["borrower_task_id"],
    )


def _card_returned(env: dict[str, Any], p: dict[str, Any]) -> Entry:
    then = ": the queued wake runs" if p["wake"] else ""
    return _entry(
        env,
        "task",
        p["task_id"],
        "card_returned",
        f"card back from {p['borrower_task_id']} ({p['borrower_status']}){then}",
        reason_code=R.LENT_CARD_RETURNED.value,
        borrower_task_id=p["borrower_task_id"],
        borrower_status=p["borrower_status"],
        wake=p["wake"],
    )


LENDING_RULES = {
    "task_sleep_measured": _sleep_measured,
    "task_card_lent": _card_lent,
    "task_card_borrowed": _card_borrowed,
    "task_wake_queued": _wake_queued,
    "task_card_returned": _card_returned,
}


def _status_kind(code: ReasonCode, to: str | None) -> str | None:
    """The timeline kind of a status change, keyed on its reason code (None: not one)."""
    if code is R.NODE_LOST:
        return "node_lost_migration" if to == "pending" else "node_lost_ended"
    if code is R.TASK_UNCONFIRMED:
        return "task_unconfirmed"
    if code is R.PREEMPTED:
        return {"preempting": "preemption", "pending": "preempted_requeue"}.get(to or "")
    if code is R.HOST_OFFLINE_ON_WAKE and to == "pending":
        return "wake_rescheduled"
    if code is R.IDLE_SLEEP and to == "sleeping":
        return "idle_sleep"
    if code is R.REQUEST_WAKE and to == "waking":
        return "request_wake"
    if code is R.LENT_CARD_RETURNED and to == "waking":
        return "wake_completed"
    if to == "failed":
        return {
            R.CONTAINER_LOST: "container_lost",
            R.TIMEOUT: "task_timeout",
            R.LIVENESS_LOST: "liveness_lost",
        }.get(code)
    return None


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
                reason_code=reason_code_of(env["type"], p).value,
            )
        ]
    if env["type"] in ("gpu_lost", "gpu_recovered"):
        lost = env["type"] == "gpu_lost"
        verb = "lost" if lost else "recovered"
        return [
            _entry(
                env,
                "node",
                node,
                env["type"],
                f"GPU {p['gpu_id']} {verb} on {node}",
                gpu_id=p["gpu_id"],
                reason_code=(R.GPU_LOST if lost else R.GPU_RECOVERED).value,
            )
        ]
    return []


GROUP_KINDS = {
    "restart_scheduled": "group_restart_scheduled",
    "group_restart": "group_restart",
    "inference_rebuild": "inference_rebuild",
    "replica_replaced": "replica_self_heal",
}


ROLLOUT_PHASE_KINDS = {
    "rollback": "rollout_rollback",
    "completed": "rollout_completed",
    "failed": "rollout_failed",
    "rolled_back": "rollout_rolled_back",
}
BATCH_CODES = {
    "started": R.ROLLOUT_ACTION,
    "ready": R.ROLLOUT_ACTION,
    "drain": R.ROLLOUT_DRAIN,
    "done": R.ROLLOUT_REPLACED,
    "failed": R.ROLLOUT_STOPPED,
    "restored": R.ROLLOUT_ROLLED_BACK,
}
BATCH_TEXT = {
    "started": "new-generation replica(s) created",
    "ready": "new replica(s) running and healthy",
    "failed": "failed",
    "done": "old replica(s) drained and cancelled",
    "restored": "old-configuration replica(s) rebuilt",
}


def rollout_entries(env: dict[str, Any]) -> list[Entry]:
    """Start, each batch, drain, rollback and the end of a rolling update."""
    p = env["payload"]
    gid = p.get("group_id", "")
    ro = p.get("rollout_id", "")
    if env["type"] == "rollout_started":
        text = f"rollout {ro} to generation {p['generation']} started"
        code = R.ROLLOUT_ACTION.value
        return [_entry(env, "group", gid, "rollout_started", text, rollout_id=ro, reason_code=code)]
    if env["type"] == "rollout_batch_recorded":
        step, ranks = p["step"], p.get("ranks", [])
        kind = "rollout_drain" if step == "drain" else "rollout_batch"
        head = f"rollout {ro} batch {p['number']} (attempt {p['attempt']}) ranks {ranks}"
        text = f"{head}: old replica(s) draining" if step == "drain" else f"{head}: "
        if step != "drain":
            text += BATCH_TEXT.get(step, step) + (f": {p['reason']}" if p.get("reason") else "")
        return [
            _entry(
                env,
                "group",
                gid,
                kind,
                text,
                rollout_id=ro,
                reason_code=BATCH_CODES.get(step, R.UNSPECIFIED).value,
                step=step,
                batch=p["number"],
                attempt=p["attempt"],
                ranks=ranks,
                task_ids=p.get("task_ids", []),
            )
        ]
    phase_kind = ROLLOUT_PHASE_KINDS.get(p.get("to_phase", ""))
    if env["type"] == "rollout_phase_changed" and phase_kind is not None:
        code = reason_code_of(env["type"], p)
        text = f"rollout {ro} {p['to_phase']}: {p['reason']}"
        return [_entry(env, "group", gid, phase_kind, text, rollout_id=ro, reason_code=code.value)]
    return []


def group_entries(env: dict[str, Any]) -> list[Entry]:
    p = env["payload"]
    gid = p.get("group_id", "")
    if env["type"].startswith("rollout_"):
        return rollout_entries(env)
    if env["type"] == "group_recovery":
        return [
            _entry(
                env,
                "group",
                gid,
                GROUP_KINDS[p["kind"]],
                p["reason"],
                reason_code=reason_code_of(env["type"], p).value,
                ranks=p.get("ranks", []),
                replaced=p.get("task_ids", []),
            )
        ]
    if env["type"] == "group_scaled":
        return [
            _entry(
                env,
                "group",
                gid,
                "group_scaled",
                f"{p['source']} scale {p['from_replicas']} → {p['to_replicas']}: {p['reason']}",
                reason_code=reason_code_of(env["type"], p).value,
                source=p["source"],
                from_replicas=p["from_replicas"],
                to_replicas=p["to_replicas"],
                added_ranks=p.get("added_ranks", []),
                removed=p.get("removed_task_ids", []),
            )
        ]
    if env["type"] == "group_window_applied":
        restored = p["action"] in ("restore", "release")
        kind = "schedule_window_restore" if restored else "schedule_window"
        return [
            _entry(
                env,
                "group",
                gid,
                kind,
                p["reason"],
                reason_code=reason_code_of(env["type"], p).value,
                action=p["action"],
                labels=p.get("labels", {}),
            )
        ]
    if env["type"] == "group_status_changed" and p["to_status"] == "failed":
        code = reason_code_of(env["type"], p)
        return [_entry(env, "group", gid, "group_failed", p["reason"], reason_code=code.value)]
    return []


def entries_for(env: dict[str, Any]) -> list[Entry]:
    rule = {"task": task_entries, "node": node_entries, "group": group_entries}.get(
        env.get("stream_type", "")
    )
    return rule(env) if rule else []
