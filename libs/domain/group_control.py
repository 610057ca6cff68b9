"""Group fault tolerance, four layers (SPEC §5, seed 000), as a pure decision.

`decide_group` looks at a group and all its tasks (remnants included) at `now` and returns
what to do: group events, member transitions and new member ranks. The controller applies
them; running it twice on the same state does nothing more (every action changes the state
it looked at).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from .events import Payload
from .group import (
    GROUP_TERMINAL,
    Group,
    GroupRecovery,
    GroupStatus,
    GroupStatusChanged,
    aggregate_status,
    current_members,
    is_live,
)
from .reasons import ReasonCode
from .states import GPU_HOLDING, TaskStatus
from .task import Task

S = TaskStatus


@dataclass(frozen=True)
class GroupPolicy:
    restart_window: timedelta = timedelta(minutes=10)  # all failed this soon after start
    restart_backoffs: tuple[timedelta, ...] = (timedelta(minutes=1), timedelta(minutes=3))
    restart_give_up_after: timedelta = timedelta(minutes=30)
    max_rebuilds: int = 5
    rebuild_priority: int = 100


@dataclass
class GroupActions:
    events: list[Payload] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)  # members with a node → stopping
    fail: list[str] = field(default_factory=list)  # members without a node → failed
    new_ranks: list[int] = field(default_factory=list)
    priority: int | None = None  # priority override of the new members

    @property
    def empty(self) -> bool:
        return not (self.events or self.stop or self.fail or self.new_ranks)


def decide_group(
    group: Group,
    tasks: Sequence[Task],
    now: datetime,
    policy: GroupPolicy,
    is_infra: Callable[[Task], bool],
    *,
    allow_rebuild: bool = True,
) -> GroupActions:
    """`allow_rebuild=False` leaves inference rebuilds to the slower rebuild scan."""
    out = GroupActions()
    if group.deleted_at is not None:
        return out
    members = current_members(tasks)
    failed = [m for m in members if m.status is S.FAILED]
    live = [m for m in members if is_live(m)]
    spec = group.spec
    if failed and not spec.static_world and live:
        # Stateless replicas: replace only the failed ranks; healthy replicas keep running.
        ranks = tuple(sorted(m.rank for m in failed if m.rank is not None))
        out.events.append(
            GroupRecovery(
                group_id=group.id,
                kind="replica_replaced",
                reason_code=ReasonCode.MEMBER_FAILED,
                reason=f"replica rank(s) {list(ranks)} failed; {len(live)} live replica(s) kept",
                ranks=ranks,
                task_ids=tuple(m.id for m in failed),
            )
        )
        out.new_ranks.extend(ranks)
        return out
    if failed and spec.is_inference and not spec.static_world and not live:
        return _rebuild(group, members, out, policy) if allow_rebuild else out
    status = aggregate_status(members, replicas=not spec.static_world)
    if status is not group.status and not (
        group.status in GROUP_TERMINAL
        and status in (GroupStatus.FAILED, GroupStatus.STOPPED, GroupStatus.COMPLETED)
    ):
        code, text = _why(status, failed)
        out.events.append(
            GroupStatusChanged(
                group_id=group.id,
                from_status=group.status,
                to_status=status,
                reason_code=code,
                reason=text,
            )
        )
    if status is GroupStatus.FAILED:
        # Judged failed: members holding a node stop, the others fail in place.
        for m in live:
            (out.stop if m.status in GPU_HOLDING and m.node_id else out.fail).append(m.id)
        if spec.static_world:
            _restart(group, members, now, policy, is_infra, out)
    return out


def _why(status: GroupStatus, failed: Sequence[Task]) -> tuple[ReasonCode, str]:
    if status is GroupStatus.FAILED and failed:
        m = failed[0]
        text = f"member rank {m.rank} failed: {m.error or 'no error text'}"
        return ReasonCode.MEMBER_FAILED, text
    return ReasonCode.MEMBERS_CHANGED, f"members are {status.value}"


def _rebuild(
    group: Group, members: Sequence[Task], out: GroupActions, policy: GroupPolicy
) -> GroupActions:
    if group.rebuilds >= policy.max_rebuilds:
        if group.status is not GroupStatus.FAILED:
            out.events.append(
                GroupStatusChanged(
                    group_id=group.id,
                    from_status=group.status,
                    to_status=GroupStatus.FAILED,
                    reason_code=ReasonCode.REBUILDS_EXHAUSTED,
                    reason=f"no live replica and {policy.max_rebuilds} rebuilds used",
                )
            )
        return out
    ranks = tuple(range(group.spec.shape.task_count))
    out.events.append(
        GroupRecovery(
            group_id=group.id,
            kind="inference_rebuild",
            ranks=ranks,
            reason_code=ReasonCode.GROUP_REBUILD,
            reason=f"no live replica: rebuild {group.rebuilds + 1}/{policy.max_rebuilds} "
            f"at priority {policy.rebuild_priority}",
            task_ids=tuple(m.id for m in members),
        )
    )
    out.new_ranks.extend(ranks)
    out.priority = policy.rebuild_priority
    return out


def _restart(
    group: Group,
    members: Sequence[Task],
    now: datetime,
    policy: GroupPolicy,
    is_infra: Callable[[Task], bool],
    out: GroupActions,
) -> None:
    """Start-up infrastructure failure: restart the whole static world (≤2, 1/3 min apart)."""
    failed = [m for m in members if m.status is S.FAILED]
    if group.restarts >= len(policy.restart_backoffs) or not failed:
        return
    if not all(is_infra(m) for m in failed):
        return  # a user-side error vetoes the restart
    starts = [m.started_at or m.created_at for m in members]
    ends = [m.finished_at or now for m in failed]
    if max(ends) - min(starts) > policy.restart_window:
        return
    failed_at = group.failed_at or now
    if now - failed_at > policy.restart_give_up_after:
        return
    if group.restart_due_at is None:
        due = failed_at + policy.restart_backoffs[group.restarts]
        out.events.append(
            GroupRecovery(
                group_id=group.id,
                kind="restart_scheduled",
                reason_code=ReasonCode.GROUP_RESTART,
                reason="start-up infrastructure failure",
                due_at=due,
            )
        )
        return
    if now >= group.restart_due_at and all(not is_live(m) for m in members):
        ranks = tuple(range(group.spec.shape.task_count))
        out.events.append(
            GroupRecovery(
                group_id=group.id,
                kind="group_restart",
                ranks=ranks,
                reason_code=ReasonCode.GROUP_RESTART,
                reason=f"whole-group restart {group.restarts + 1}/{len(policy.restart_backoffs)}"
                " after a start-up infrastructure failure",
                task_ids=tuple(m.id for m in members),
            )
        )
        out.new_ranks.extend(ranks)
