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

from libs.domain.group.events import GroupRecovery, GroupStatusChanged
from libs.domain.group.model import (
    GROUP_TERMINAL,
    Group,
    GroupStatus,
    aggregate_status,
    current_members,
    is_live,
    sized_members,
)
from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.rollout.model import ACTIVE, RolloutPhase
from libs.domain.task.model import Task
from libs.domain.task.states import GPU_HOLDING, TaskStatus

S = TaskStatus
ENDING = frozenset({S.STOPPING, S.DRAINING, S.PREEMPTING})


@dataclass(frozen=True)
class GroupPolicy:
    restart_window: timedelta = timedelta(minutes=10)  # all failed this soon after start
    restart_backoffs: tuple[timedelta, ...] = (timedelta(minutes=1), timedelta(minutes=3))
    restart_give_up_after: timedelta = timedelta(minutes=30)
    max_rebuilds: int = 5
    rebuild_priority: int = 100
    # Replica self-heal of stateless groups: a rank that failed more than
    # `replica_max_restarts` times within `replica_crash_window` is a crash loop and fails
    # the group; before that, the k-th failure (k >= 2) waits base × 2^(k-2), capped.
    replica_max_restarts: int = 5
    replica_crash_window: timedelta = timedelta(minutes=10)
    replica_backoff: timedelta = timedelta(seconds=10)
    replica_backoff_max: timedelta = timedelta(minutes=5)

    def replica_delay(self, failures: int) -> timedelta:
        """How long the replacement after the `failures`-th recent failure of a rank waits."""
        if failures <= 1:
            return timedelta(0)
        delay: timedelta = self.replica_backoff * 2 ** (failures - 2)
        return min(delay, self.replica_backoff_max)


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
    if group.rollout is not None and group.rollout.phase in ACTIVE:
        # The rollout controller owns the members until its rollout ends (a new replica
        # that fails is its batch's failure, not a self-heal; old and new replicas of one
        # rank are both live).
        return out
    members = sized_members(group, current_members(tasks))
    failed = [m for m in members if m.status is S.FAILED]
    live = [m for m in members if is_live(m)]
    spec = group.spec
    if failed and not spec.static_world and live:
        return _self_heal(group, tasks, failed, live, now, policy, out)
    if failed and spec.is_inference and not spec.static_world and not live:
        return _rebuild(group, members, out, policy) if allow_rebuild else out
    if failed and spec.is_inference and spec.static_world:
        return _rebuild_world(group, members, live, out, policy, allow_rebuild)
    status = aggregate_status(members, replicas=not spec.static_world)
    if (
        status is not group.status
        and not (
            group.status in GROUP_TERMINAL
            and status in (GroupStatus.FAILED, GroupStatus.STOPPED, GroupStatus.COMPLETED)
        )
        and not failed_by_rollout(group)
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


def failed_by_rollout(group: Group) -> bool:
    """The group is `failed` because its last rollout failed (seed 000: the old configuration
    is rebuilt and serves, the group is failed with the reason): that status stays until the
    next rollout, while its members are still self-healed."""
    r = group.rollout
    return (
        group.status is GroupStatus.FAILED
        and r is not None
        and r.phase is RolloutPhase.FAILED
        and group.reason_code is r.reason_code
    )


def recent_failures(
    tasks: Sequence[Task], rank: int | None, now: datetime, window: timedelta
) -> int:
    """Failed attempts of one rank (remnants included) that ended within `window`."""
    return sum(
        1
        for t in tasks
        if t.rank == rank
        and t.status is S.FAILED
        and now - (t.finished_at or t.updated_at) <= window
    )


def _self_heal(
    group: Group,
    tasks: Sequence[Task],
    failed: Sequence[Task],
    live: Sequence[Task],
    now: datetime,
    policy: GroupPolicy,
    out: GroupActions,
) -> GroupActions:
    """Stateless replicas: replace only the failed ranks, healthy replicas keep running; a
    crash-looping rank backs off exponentially and past its cap fails the group."""
    due: list[Task] = []
    for m in failed:
        n = recent_failures(tasks, m.rank, now, policy.replica_crash_window)
        if n > policy.replica_max_restarts:
            if group.status not in GROUP_TERMINAL:
                window_min = policy.replica_crash_window.total_seconds() / 60
                out.events.append(
                    GroupStatusChanged(
                        group_id=group.id,
                        from_status=group.status,
                        to_status=GroupStatus.FAILED,
                        reason_code=ReasonCode.CRASH_LOOP,
                        reason=f"replica rank {m.rank} failed {n} times within "
                        f"{window_min:g} min (cap {policy.replica_max_restarts} restarts): "
                        f"crash loop; last error: {m.error or 'none'}",
                    )
                )
                for t in live:
                    (out.stop if t.status in GPU_HOLDING and t.node_id else out.fail).append(t.id)
            return out
        if now >= (m.finished_at or m.updated_at) + policy.replica_delay(n):
            due.append(m)
    if not due:
        return out  # backing off: the failed rows wait, the group stays as it is
    ranks = tuple(sorted(m.rank for m in due if m.rank is not None))
    out.events.append(
        GroupRecovery(
            group_id=group.id,
            kind="replica_replaced",
            reason_code=ReasonCode.MEMBER_FAILED,
            reason=f"replica rank(s) {list(ranks)} failed; {len(live)} live replica(s) kept",
            ranks=ranks,
            task_ids=tuple(m.id for m in due),
        )
    )
    out.new_ranks.extend(ranks)
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
    ranks = tuple(range(group.size))
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


def _rebuild_world(
    group: Group,
    members: Sequence[Task],
    live: Sequence[Task],
    out: GroupActions,
    policy: GroupPolicy,
    allow_rebuild: bool,
) -> GroupActions:
    """Layer 3 for a tensor/pipeline-parallel inference group: a failed rank breaks the whole
    world, so its other ranks end first, then every rank is rebuilt as new rows, at priority
    100 and at most `max_rebuilds` times, as a replica group with no live replica is."""
    if live:
        for m in live:
            if m.status not in ENDING:  # already on its way out: nothing more to ask
                (out.stop if m.status in GPU_HOLDING and m.node_id else out.fail).append(m.id)
        return out
    return _rebuild(group, members, out, policy) if allow_rebuild else out


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
