"""Changing a group's replica count (SPEC §5): who may be scaled, and what a scale does.

Pure decisions: `decide_scale` takes the group and its tasks and returns the group event,
the ranks to create and the members to stop. The gateway (manual scale), the AutoScaler
and the schedule-window controller all go through it, so a scale means the same thing
whoever asks for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from libs.domain.errors import Code, DomainError
from libs.domain.group.events import GroupScaled
from libs.domain.group.model import Group, current_members, is_live
from libs.domain.reasons import ReasonCode
from libs.domain.task.model import Task, TaskSpec, TenantId
from libs.domain.task.states import TaskStatus

MAX_REPLICAS = 1024
S = TaskStatus
_LEAVING = frozenset({S.STOPPING, S.DRAINING})


@dataclass
class ScalePlan:
    event: GroupScaled | None = None
    new_ranks: list[int] = field(default_factory=list)
    stop: list[Task] = field(default_factory=list)

    def new_members(self, group: Group) -> list[tuple[TenantId, TaskSpec, str, int]]:
        """The tasks of the new ranks, as the store creates them with the group event."""
        spec = group.spec
        tenant = TenantId(group.tenant_id)
        return [(tenant, spec.member_spec(r), group.id, r) for r in self.new_ranks]


def check_scalable(group: Group) -> None:
    """Static-world groups (training, tensor/pipeline parallel) have a fixed world size."""
    if group.deleted_at is not None:
        raise DomainError(Code.NOT_FOUND, "task group not found")
    spec = group.spec
    if spec.static_world:
        why = (
            "task_type=training"
            if spec.is_training
            else f"parallelism={spec.shape.parallelism.value}"
        )
        raise DomainError(
            Code.INVALID_VALUE,
            f"a static-world group ({why}) has a world size fixed at creation and cannot be scaled",
            ["replicas"],
        )


def parse_replicas(value: object, name: str = "replicas") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_REPLICAS:
        raise DomainError(
            Code.INVALID_VALUE, f"{name} must be an integer in 0..{MAX_REPLICAS}", [name]
        )
    return value


def decide_scale(
    group: Group,
    tasks: Sequence[Task],
    replicas: int,
    *,
    source: str = "user",
    code: ReasonCode = ReasonCode.USER_SCALE,
    reason: str = "",
    revive: bool = False,
    removed: Sequence[str] | None = None,
) -> ScalePlan:
    """Scale to `replicas`: new ranks `size..replicas-1`, or stop the ranks at and above
    `replicas`. Same size → an empty plan (nothing is written).

    `revive` (the AutoScaler's scale from zero): ranks below both sizes whose member has
    ended get a new task too, so a group whose every replica was stopped comes back.
    `removed`: the members the scale-down sheds when the caller chose them (a `split`
    group's least busy, libs/domain/group/shedding.py), for the event; else the ranks at
    and above `replicas`. A member marked draining counts as leaving: a scale back up gives
    its rank a new task."""
    check_scalable(group)
    old = group.size
    members = current_members(tasks)
    by_rank = {m.rank: m for m in members}
    plan = ScalePlan()
    plan.new_ranks = [
        r
        for r in range(0 if revive else old, replicas)
        if r not in by_rank
        or not is_live(by_rank[r])
        or by_rank[r].status in _LEAVING
        or by_rank[r].draining
    ]
    if replicas == old and not plan.new_ranks:
        return ScalePlan()
    if replicas < old:
        plan.stop = [
            m
            for m in members
            if m.rank is not None and m.rank >= replicas and is_live(m) and m.status not in _LEAVING
        ]
    plan.event = GroupScaled(
        group_id=group.id,
        from_replicas=old,
        to_replicas=replicas,
        source=source,
        added_ranks=tuple(plan.new_ranks),
        removed_task_ids=tuple(m.id for m in plan.stop) if removed is None else tuple(removed),
        reason_code=code,
        reason=reason or f"{source} scale {old} → {replicas}",
    )
    return plan
