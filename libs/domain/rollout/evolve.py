"""The rollout fold: what a group carries of its rolling update."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from libs.domain.payload import Payload
from libs.domain.rollout.events import (
    RolloutBatchRecorded,
    RolloutLeaseReleased,
    RolloutLeaseRenewed,
    RolloutPartitionChanged,
    RolloutPhaseChanged,
    RolloutStarted,
)
from libs.domain.rollout.model import BatchRecord, Rollout, RolloutPhase


def fold_rollout(rollout: Rollout | None, event: Payload, at: datetime) -> dict[str, Any]:
    """The group fields one rollout event changes."""
    if isinstance(event, RolloutStarted):
        started = Rollout(
            id=event.rollout_id,
            generation=event.generation,
            from_generation=event.generation - 1,
            request=event.request,
            previous=event.previous,
            target=event.target,
            started_at=at,
            updated_at=at,
        )
        return {"generation": event.generation, "rollout": started}
    if rollout is None or getattr(event, "rollout_id", None) != rollout.id:
        raise ValueError(f"{event.type} for a rollout the group does not hold")
    if isinstance(event, RolloutPhaseChanged):
        update: dict[str, Any] = {
            "phase": event.to_phase,
            "reason_code": event.reason_code,
            "reason": event.reason,
        }
        if event.from_phase is RolloutPhase.PAUSED and event.to_phase is RolloutPhase.RUNNING:
            update["resumed_at"] = at
    elif isinstance(event, RolloutPartitionChanged):
        request = rollout.request.model_copy(update={"partition": event.partition})
        update = {"request": request}
    elif isinstance(event, RolloutBatchRecorded):
        record = BatchRecord(
            number=event.number,
            attempt=event.attempt,
            step=event.step,
            ranks=event.ranks,
            task_ids=event.task_ids,
            at=at,
            reason=event.reason,
        )
        update = {"batches": (*rollout.batches, record)}
    elif isinstance(event, RolloutLeaseRenewed):
        update = {"holder": event.holder, "lease_renewed_at": at}
    elif isinstance(event, RolloutLeaseReleased):
        # Only the holder's own release frees the lease (a late one from an instance
        # already replaced changes nothing).
        update = {"holder": ""} if event.holder == rollout.holder else {}
    else:
        raise ValueError(f"not a rollout event: {event.type}")
    return {"rollout": rollout.model_copy(update=update | {"updated_at": at})}
