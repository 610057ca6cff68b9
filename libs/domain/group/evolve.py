"""The group fold."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from libs.domain.group.events import (
    GroupConfigUpdated,
    GroupCreated,
    GroupDeleted,
    GroupRecovery,
    GroupScaled,
    GroupStatusChanged,
    GroupWindowApplied,
)
from libs.domain.group.model import Group, GroupStatus
from libs.domain.group.policy import (
    GroupAutoscaleDecided,
    GroupAutoscaleSampled,
    GroupScalingUpdated,
)
from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.rollout.events import ROLLOUT_EVENTS, RolloutPhaseChanged
from libs.domain.rollout.evolve import fold_rollout
from libs.domain.rollout.model import RolloutPhase


def evolve_group(group: Group | None, event: Payload, at: datetime, version: int) -> Group:
    if isinstance(event, GroupCreated):
        return Group(
            id=event.group_id,
            tenant_id=event.tenant_id,
            spec=event.spec,
            reason_code=ReasonCode.SUBMITTED,
            version=version,
            created_at=at,
            updated_at=at,
        )
    if group is None:
        raise ValueError(f"{event.type} before group_created")
    up: dict[str, Any] = {"version": version, "updated_at": at}
    if isinstance(event, GroupStatusChanged):
        up.update(status=event.to_status, reason=event.reason, reason_code=event.reason_code)
        if event.to_status is GroupStatus.FAILED:
            up["failed_at"] = at
    elif isinstance(event, GroupRecovery):
        if event.kind == "restart_scheduled":
            up["restart_due_at"] = event.due_at
        elif event.kind == "group_restart":
            up.update(
                restarts=group.restarts + 1,
                restart_due_at=None,
                failed_at=None,
                status=GroupStatus.PENDING,
                reason=event.reason,
                reason_code=event.reason_code,
            )
        elif event.kind == "inference_rebuild":
            up.update(
                rebuilds=group.rebuilds + 1,
                failed_at=None,
                status=GroupStatus.PENDING,
                reason=event.reason,
                reason_code=event.reason_code,
            )
        elif event.kind == "replica_replaced":
            up["replacements"] = group.replacements + len(event.ranks)
    elif isinstance(event, GroupConfigUpdated):
        template = group.spec.template.model_copy(update=event.changes)
        up["spec"] = group.spec.model_copy(update={"template": template})
    elif isinstance(event, GroupScaled):
        up.update(replicas=event.to_replicas, scaled_at=at)
        if event.to_replicas > event.from_replicas:
            up["scaled_up_at"] = at
    elif isinstance(event, GroupScalingUpdated):
        changes = {f: getattr(event, f) for f in event.fields}
        up["spec"] = group.spec.model_copy(update=changes)
    elif isinstance(event, GroupAutoscaleDecided):
        up["last_autoscale"] = event.as_last(at)
    elif isinstance(event, GroupAutoscaleSampled):
        pass  # what a decision was made on: read by the policy replay, not folded
    elif isinstance(event, GroupWindowApplied):
        up["labels"] = dict(event.labels)
    elif isinstance(event, GroupDeleted):
        up["deleted_at"] = at
    elif isinstance(event, ROLLOUT_EVENTS):
        up.update(fold_rollout(group.rollout, event, at))
        if isinstance(event, RolloutPhaseChanged) and event.to_phase is RolloutPhase.COMPLETED:
            # Completed: the new generation's template is the group's from now on (a
            # self-healed or scaled-up replica is built from it).
            template = up["rollout"].target
            up["spec"] = group.spec.model_copy(update={"template": template})
    else:
        raise ValueError(f"not a group event: {event.type}")
    return group.model_copy(update=up)
