"""The timeline rules of group events: recovery, scaling, windows, failure and rollouts (pure).

See `rules.py`: one rule per event type, keyed on kinds, steps, phases and reason codes.
"""

from __future__ import annotations

from libs.domain.envelope import EventEnvelope
from libs.domain.group.events import (
    GroupRecovery,
    GroupScaled,
    GroupStatusChanged,
    GroupWindowApplied,
)
from libs.domain.group.model import GroupStatus
from libs.domain.reasons import ReasonCode
from libs.domain.rollout.events import RolloutBatchRecorded, RolloutPhaseChanged, RolloutStarted

from .entry import Entry, entry

R = ReasonCode


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


def rollout_started(env: EventEnvelope, ev: RolloutStarted) -> list[Entry]:
    ro = ev.rollout_id
    text = f"rollout {ro} to generation {ev.generation} started"
    code = R.ROLLOUT_ACTION.value
    return [
        entry(env, "group", ev.group_id, "rollout_started", text, rollout_id=ro, reason_code=code)
    ]


def rollout_batch(env: EventEnvelope, ev: RolloutBatchRecorded) -> list[Entry]:
    """Each step of a batch; the drain of its old replicas is a kind of its own."""
    ro, step, ranks = ev.rollout_id, ev.step.value, list(ev.ranks)
    kind = "rollout_drain" if step == "drain" else "rollout_batch"
    head = f"rollout {ro} batch {ev.number} (attempt {ev.attempt}) ranks {ranks}"
    text = f"{head}: old replica(s) draining" if step == "drain" else f"{head}: "
    if step != "drain":
        text += BATCH_TEXT.get(step, step) + (f": {ev.reason}" if ev.reason else "")
    return [
        entry(
            env,
            "group",
            ev.group_id,
            kind,
            text,
            rollout_id=ro,
            reason_code=BATCH_CODES.get(step, R.UNSPECIFIED).value,
            step=step,
            batch=ev.number,
            attempt=ev.attempt,
            ranks=ranks,
            task_ids=list(ev.task_ids),
        )
    ]


def rollout_phase(env: EventEnvelope, ev: RolloutPhaseChanged) -> list[Entry]:
    """The rollback and the end of a rolling update (pause and resume are no entry)."""
    phase_kind = ROLLOUT_PHASE_KINDS.get(ev.to_phase.value)
    if phase_kind is None:
        return []
    ro = ev.rollout_id
    text = f"rollout {ro} {ev.to_phase.value}: {ev.reason}"
    code = ev.reason_code.value
    return [entry(env, "group", ev.group_id, phase_kind, text, rollout_id=ro, reason_code=code)]


def group_recovery(env: EventEnvelope, ev: GroupRecovery) -> list[Entry]:
    return [
        entry(
            env,
            "group",
            ev.group_id,
            GROUP_KINDS[ev.kind],
            ev.reason,
            reason_code=ev.reason_code.value,
            ranks=list(ev.ranks),
            replaced=list(ev.task_ids),
        )
    ]


def group_scaled(env: EventEnvelope, ev: GroupScaled) -> list[Entry]:
    return [
        entry(
            env,
            "group",
            ev.group_id,
            "group_scaled",
            f"{ev.source} scale {ev.from_replicas} → {ev.to_replicas}: {ev.reason}",
            reason_code=ev.reason_code.value,
            source=ev.source,
            from_replicas=ev.from_replicas,
            to_replicas=ev.to_replicas,
            added_ranks=list(ev.added_ranks),
            removed=list(ev.removed_task_ids),
        )
    ]


def group_window(env: EventEnvelope, ev: GroupWindowApplied) -> list[Entry]:
    restored = ev.action in ("restore", "release")
    kind = "schedule_window_restore" if restored else "schedule_window"
    return [
        entry(
            env,
            "group",
            ev.group_id,
            kind,
            ev.reason,
            reason_code=ev.reason_code.value,
            action=ev.action,
            labels=dict(ev.labels),
        )
    ]


def group_status(env: EventEnvelope, ev: GroupStatusChanged) -> list[Entry]:
    if ev.to_status is not GroupStatus.FAILED:
        return []
    code = ev.reason_code.value
    return [entry(env, "group", ev.group_id, "group_failed", ev.reason, reason_code=code)]
