"""Which committed events are real fault-tolerance transitions, and how they read (pure).

One rule per event type, taking the envelope and the payload's model (parsed once, by the
consumer's typed handlers: libs/bus/typed.py), keyed on statuses and reason codes, never on
reason text. An event that is not such a transition yields nothing: the timeline never
invents entries. Every entry's details carry the reason code, for clients to branch on.
Task and node rules are here, group and rollout rules in `group_rules.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from libs.domain.envelope import EventEnvelope
from libs.domain.group.events import (
    GroupRecovery,
    GroupScaled,
    GroupStatusChanged,
    GroupWindowApplied,
)
from libs.domain.node.events import (
    CardQuarantined,
    CardRestored,
    GpuLost,
    GpuRecovered,
    NodeOffline,
)
from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.rollout.events import RolloutBatchRecorded, RolloutPhaseChanged, RolloutStarted
from libs.domain.task.events import TaskRetryDecided, TaskStatusChanged
from libs.domain.task.lending import (
    TaskCardBorrowed,
    TaskCardLent,
    TaskCardReturned,
    TaskSleepMeasured,
    TaskWakeQueued,
)
from libs.domain.task.states import TaskStatus

from .entry import KINDS, Entry, entry
from .group_rules import (
    group_recovery,
    group_scaled,
    group_status,
    group_window,
    rollout_batch,
    rollout_phase,
    rollout_started,
)

R = ReasonCode
S = TaskStatus


# --- tasks -------------------------------------------------------------------------------

RETRY_KINDS = {
    "retry": ("retry_escalation", R.RETRY),
    "give_up": ("retry_given_up", R.RETRY_GIVEN_UP),
    "requeue": ("device_requeue", R.DEVICE_REQUEUE),
}


def retry_decided(env: EventEnvelope, ev: TaskRetryDecided) -> list[Entry]:
    kind, code = RETRY_KINDS.get(ev.action, (None, R.UNSPECIFIED))
    if kind is None:
        return []
    return [
        entry(
            env,
            "task",
            ev.task_id,
            kind,
            ev.reason,
            reason_code=code.value,
            attempt=ev.attempt,
            failure_class=ev.failure_class,
            node_id=ev.node_id,
            memory_mb=ev.memory_mb,
            delay_s=ev.delay_s,
            device_verdict=ev.device_verdict,
            device_evidence=ev.device_evidence,
        )
    ]


def status_changed(env: EventEnvelope, ev: TaskStatusChanged) -> list[Entry]:
    code = ev.reason_code
    if ev.variant is not None and ev.to_status is S.SCHEDULED:
        return variant_placed(env, ev)
    src, to = ev.from_status.value, ev.to_status.value
    kind = _status_kind(code, ev.to_status)
    if kind is None:
        return []
    text = ev.reason or code.text  # shown, never matched
    message = (
        {
            "node_lost_migration": f"{text}: {src} → pending, to be placed on another node",
            "node_lost_ended": f"{text}: {src} → {to} in place",
            "task_unconfirmed": f"{text}: {src} → {to}",
            "preemption": text,
            "preempted_requeue": "preempted: back to pending",
            "wake_rescheduled": R.HOST_OFFLINE_ON_WAKE.text,
        }.get(kind)
        or ev.error
        or text
    )
    details: dict[str, Any] = {"reason_code": code.value}
    if kind in ("node_lost_migration", "node_lost_ended", "task_unconfirmed", "preemption"):
        details["from_status"] = src
    if kind in ("node_lost_ended", "task_unconfirmed"):
        details["to_status"] = to
    return [entry(env, "task", ev.task_id, kind, message, **details)]


def variant_placed(env: EventEnvelope, ev: TaskStatusChanged) -> list[Entry]:
    """Which of a task's variants a placement runs (docs/scheduling.md#variants)."""
    cards = ev.gpu_label or "no GPU"
    return [
        entry(
            env,
            "task",
            ev.task_id,
            "variant_placed",
            f"placed variants[{ev.variant}] ({cards}) on node {ev.node_id}",
            reason_code=ev.reason_code.value,
            variant=ev.variant,
            node_id=ev.node_id,
            gpu_label=ev.gpu_label,
            gpu_ids=list(ev.gpu_ids or ()),
        )
    ]


def _status_kind(code: ReasonCode, to: TaskStatus) -> str | None:
    """The timeline kind of a status change, keyed on its reason code (None: not one)."""
    if code is R.NODE_LOST:
        return "node_lost_migration" if to is S.PENDING else "node_lost_ended"
    if code is R.TASK_UNCONFIRMED:
        return "task_unconfirmed"
    if code is R.PREEMPTED:
        return {S.PREEMPTING: "preemption", S.PENDING: "preempted_requeue"}.get(to)
    if code is R.HOST_OFFLINE_ON_WAKE and to is S.PENDING:
        return "wake_rescheduled"
    if code is R.IDLE_SLEEP and to is S.SLEEPING:
        return "idle_sleep"
    if code is R.REQUEST_WAKE and to is S.WAKING:
        return "request_wake"
    if code is R.LENT_CARD_RETURNED and to is S.WAKING:
        return "wake_completed"
    if to is S.FAILED:
        return {
            R.CONTAINER_LOST: "container_lost",
            R.TIMEOUT: "task_timeout",
            R.LIVENESS_LOST: "liveness_lost",
        }.get(code)
    return None


def sleep_measured(env: EventEnvelope, ev: TaskSleepMeasured) -> list[Entry]:
    before, after = ev.vram_before_mb, ev.vram_after_mb
    figures = f"VRAM {before} → {after} MB" if before is not None else "no VRAM reading"
    verdict = "card lendable" if ev.released else f"not lendable: {ev.why}"
    return [
        entry(
            env,
            "task",
            ev.task_id,
            "sleep_measured",
            f"asleep ({ev.sleep_mode}), {figures}: {verdict}",
            reason_code=R.USER_SLEEP.value,
            sleep_mode=ev.sleep_mode,
            vram_before_mb=before,
            vram_after_mb=after,
            released_fraction=ev.released_fraction,
            min_released_fraction=ev.min_released_fraction,
            released=ev.released,
        )
    ]


def card_lent(env: EventEnvelope, ev: TaskCardLent) -> list[Entry]:
    cards = ", ".join(ev.gpu_ids)
    return [
        entry(
            env,
            "task",
            ev.task_id,
            "card_lent",
            f"card {cards} lent to training task {ev.borrower_task_id} while asleep",
            reason_code=R.CARD_BORROWED.value,
            borrower_task_id=ev.borrower_task_id,
            node_id=ev.node_id,
            gpu_ids=list(ev.gpu_ids),
        )
    ]


def card_borrowed(env: EventEnvelope, ev: TaskCardBorrowed) -> list[Entry]:
    cards = ", ".join(ev.gpu_ids)
    return [
        entry(
            env,
            "task",
            ev.task_id,
            "card_borrowed",
            f"runs on card {cards} of sleeping task {ev.lender_task_id} (lent)",
            reason_code=R.CARD_BORROWED.value,
            lender_task_id=ev.lender_task_id,
            node_id=ev.node_id,
            gpu_ids=list(ev.gpu_ids),
        )
    ]


def wake_queued(env: EventEnvelope, ev: TaskWakeQueued) -> list[Entry]:
    return [
        entry(
            env,
            "task",
            ev.task_id,
            "wake_queued",
            f"wake queued until {ev.borrower_task_id} gives its card back",
            reason_code=R.WAKE_QUEUED.value,
            borrower_task_id=ev.borrower_task_id,
        )
    ]


def card_returned(env: EventEnvelope, ev: TaskCardReturned) -> list[Entry]:
    then = ": the queued wake runs" if ev.wake else ""
    return [
        entry(
            env,
            "task",
            ev.task_id,
            "card_returned",
            f"card back from {ev.borrower_task_id} ({ev.borrower_status}){then}",
            reason_code=R.LENT_CARD_RETURNED.value,
            borrower_task_id=ev.borrower_task_id,
            borrower_status=ev.borrower_status,
            wake=ev.wake,
        )
    ]


# --- nodes -------------------------------------------------------------------------------


def node_offline(env: EventEnvelope, ev: NodeOffline) -> list[Entry]:
    state = "gone for good" if ev.gone else "offline"
    return [
        entry(
            env,
            "node",
            ev.node_id,
            "node_offline",
            f"node {ev.node_id} {state} after {ev.silent_seconds:.0f}s of silence",
            reason_code=ev.reason_code.value,
        )
    ]


def gpu_changed(env: EventEnvelope, ev: GpuLost | GpuRecovered) -> list[Entry]:
    lost = isinstance(ev, GpuLost)
    verb = "lost" if lost else "recovered"
    return [
        entry(
            env,
            "node",
            ev.node_id,
            ev.type,
            f"GPU {ev.gpu_id} {verb} on {ev.node_id}",
            gpu_id=ev.gpu_id,
            reason_code=(R.GPU_LOST if lost else R.GPU_RECOVERED).value,
        )
    ]


def card_quarantined(env: EventEnvelope, ev: CardQuarantined) -> list[Entry]:
    """On the node's timeline, and on the task's whose failure showed the fault."""
    message = f"GPU {ev.gpu_id} quarantined on {ev.node_id} ({ev.code}): {ev.evidence}"
    details = {
        "gpu_id": ev.gpu_id,
        "code": ev.code,
        "evidence": ev.evidence,
        "by": ev.by,
        "reason_code": R.CARD_QUARANTINED.value,
    }
    out = [entry(env, "node", ev.node_id, ev.type, message, **details)]
    if ev.task_id:
        out.append(entry(env, "task", ev.task_id, ev.type, message, node_id=ev.node_id, **details))
    return out


def card_restored(env: EventEnvelope, ev: CardRestored) -> list[Entry]:
    how = f"after {ev.probes_passed} passed health probes" if ev.by == "probe" else "by an operator"
    return [
        entry(
            env,
            "node",
            ev.node_id,
            ev.type,
            f"GPU {ev.gpu_id} back in placement on {ev.node_id} {how}",
            gpu_id=ev.gpu_id,
            by=ev.by,
            probes_passed=ev.probes_passed,
            reason_code=R.CARD_RESTORED.value,
        )
    ]


def gpu_lost(env: EventEnvelope, ev: GpuLost) -> list[Entry]:
    return gpu_changed(env, ev)


def gpu_recovered(env: EventEnvelope, ev: GpuRecovered) -> list[Entry]:
    return gpu_changed(env, ev)


Rule = Callable[[EventEnvelope, Any], list[Entry]]

# Every rule by the payload model it reads; an event of another type is no transition.
RULES: dict[type[Payload], Rule] = {
    TaskStatusChanged: status_changed,
    TaskRetryDecided: retry_decided,
    TaskSleepMeasured: sleep_measured,
    TaskCardLent: card_lent,
    TaskCardBorrowed: card_borrowed,
    TaskWakeQueued: wake_queued,
    TaskCardReturned: card_returned,
    NodeOffline: node_offline,
    GpuLost: gpu_lost,
    GpuRecovered: gpu_recovered,
    CardQuarantined: card_quarantined,
    CardRestored: card_restored,
    RolloutStarted: rollout_started,
    RolloutBatchRecorded: rollout_batch,
    RolloutPhaseChanged: rollout_phase,
    GroupRecovery: group_recovery,
    GroupScaled: group_scaled,
    GroupWindowApplied: group_window,
    GroupStatusChanged: group_status,
}


def entries_for(env: EventEnvelope, ev: Payload) -> list[Entry]:
    """The entries one event makes (none when it is no fault-tolerance transition)."""
    rule = RULES.get(type(ev))
    return rule(env, ev) if rule else []


__all__ = ["KINDS", "RULES", "Entry", "Rule", "entries_for"]
