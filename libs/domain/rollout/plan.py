"""The rollout controller's decisions (pure): the next step of one group's rolling update.

`plan_rollout` looks at a group, all its tasks, which new replicas pass their health check
and which draining ones have no request in flight, at `now`, and says what to do: group
events (batch history, phase changes), ranks to create in the new generation or to restore
in the old one, replicas to mark draining, old replicas to end and new ones to stop. The
controller applies it; every step changes the state it looked at, so a second pass on the
same state adds nothing.

One batch at a time (seed 000, 滚动更新), with Kubernetes Deployment semantics: a batch is
at most `max_surge + max_unavailable` ranks. The old replicas of the ranks beyond `max_surge`
(every rank under `recreate`) are taken out of service first (drained, ended); once they have
ended, every rank of the batch gets its new-generation replica; the batch waits until each
runs and is healthy, marks the remaining old replicas draining, waits for their in-flight
requests (at most `drain_timeout`) and ends them `cancelled`. A batch
whose new replica dies or is not healthy within `health_timeout_s` fails: its new replicas
are stopped and it is tried again, at most `batch_retries` more times; then the rollout rolls
back (new generation stopped, old configuration rebuilt where it is gone) and ends `failed`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from libs.domain.group.events import GroupStatusChanged
from libs.domain.group.model import Group, GroupSpec, GroupStatus
from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.rollout.events import (
    RolloutBatchRecorded,
    RolloutLeaseRenewed,
    RolloutPhaseChanged,
)
from libs.domain.rollout.model import BatchRecord, BatchStep, Rollout, RolloutPhase
from libs.domain.task.model import Task, TaskSpec
from libs.domain.task.states import TERMINAL, TaskStatus

S = TaskStatus
# A new-generation replica may be placed past the tenant's GPU quota by at most
# `spec.platform.surge_cards` (the surge replicas' cards; SPEC §5 surge quota): server-owned,
# set only here, never by a label.
# Old replicas are ended once their new replica is healthy; these statuses end directly.
_DRAINABLE = frozenset({S.RUNNING})
_ENDING = frozenset({S.DRAINING, S.STOPPING})


@dataclass(frozen=True)
class RolloutPolicy:
    batch_retries: int = 3  # a failed batch is tried again at most this many times
    drain_timeout: timedelta = timedelta(seconds=15)  # in-flight requests waited for
    # A draining replica's in-flight count is trusted only after the routers have seen the
    # drain mark and reported since (their refresh and metrics intervals).
    drain_min: timedelta = timedelta(seconds=2)
    # The group's rollout lease (seed 000: TTL 60 s, renewed every 15 s): a lease not
    # renewed for `lease_ttl` has expired, and the controller that finds it so takes it over.
    lease_renew: timedelta = timedelta(seconds=15)
    lease_ttl: timedelta = timedelta(seconds=60)

    def __post_init__(self) -> None:
        if self.lease_renew >= self.lease_ttl:
            raise ValueError(
                f"the rollout lease renewal ({self.lease_renew.total_seconds():g}s) must be "
                f"shorter than its TTL ({self.lease_ttl.total_seconds():g}s): a live holder's "
                "lease would expire between two renewals"
            )


@dataclass
class RolloutStep:
    events: list[Payload] = field(default_factory=list)
    create: list[int] = field(default_factory=list)  # ranks: new generation (target)
    restore: list[int] = field(default_factory=list)  # ranks: old configuration rebuilt
    drain: list[str] = field(default_factory=list)  # old replicas: mark draining
    end: list[str] = field(default_factory=list)  # old replicas: end (cancelled)
    stop: list[str] = field(default_factory=list)  # new replicas: stop

    @property
    def empty(self) -> bool:
        return not (
            self.events or self.create or self.restore or self.drain or self.end or self.stop
        )


def cards_of(spec: TaskSpec) -> float:
    """GPU cards one replica counts against the quota (a fraction's compute share)."""
    return float(spec.gpu_required) if spec.gpu_required else float(spec.gpu_compute_ratio or 0)


def replica_spec(group: Group, template: TaskSpec, rank: int, surge_cards: float = 0) -> TaskSpec:
    """A member of `template` at `rank`: the user's intent (env, volumes, resources,
    priority, labels) as the template has it. Placement (node, cards, fraction ids) lives on
    the task, never in the spec, and the topology variables (WORLD_SIZE, MASTER_ADDR, ...)
    are injected at dispatch, never stored: a new replica starts with neither, and a user's
    own variable of the same name in `env` stays."""
    spec = GroupSpec(template=template, shape=group.spec.shape).member_spec(rank)
    if surge_cards > 0:
        platform = spec.platform.model_copy(update={"surge_cards": surge_cards})
        spec = spec.model_copy(update={"platform": platform})
    return spec


def batch_width(rollout: Rollout, size: int) -> int:
    """Ranks per batch: `max_surge + max_unavailable`; `recreate` replaces the whole world
    in one batch."""
    req = rollout.request
    return size if req.strategy == "recreate" else req.max_surge + req.max_unavailable


def down_ranks(rollout: Rollout, batch: Sequence[int]) -> tuple[int, ...]:
    """The ranks of a batch whose old replica leaves service before its replacement is
    created: those beyond `max_surge` (at most `max_unavailable` of them, since a batch is no
    wider than both together); under `recreate` the whole old world stops first."""
    if rollout.request.strategy == "recreate":
        return tuple(batch)
    return tuple(batch[rollout.request.max_surge :])


def surge_cards(rollout: Rollout, size: int) -> float:
    """Cards a new replica may hold over the tenant's quota: the surge replicas' (none under
    `recreate`, whose old world has ended before the new one is created)."""
    if rollout.request.strategy == "recreate":
        return 0.0
    return rollout.request.max_surge * cards_of(rollout.target)


# --- the lease on the group's rollout ---------------------------------------------------


def decide_lease(
    group: Group, me: str, now: datetime, policy: RolloutPolicy
) -> tuple[bool, list[Payload]]:
    """(ours, events): take an untaken lease, renew ours when due. Another holder's lease
    lives `lease_ttl` from its last renewal; an expired one is taken over, and since its
    holder vanished without handing the rollout over (a crash: a graceful stop releases it),
    the taking over is the seed's recovery: the rollout fails with the reason (replicas of
    both generations may be serving)."""
    r = group.rollout
    assert r is not None
    take = RolloutLeaseRenewed(group_id=group.id, rollout_id=r.id, holder=me)
    if r.holder in ("", me):
        due = r.lease_renewed_at is None or now - r.lease_renewed_at >= policy.lease_renew
        return True, [take] if r.holder == "" or due else []
    silent = now - (r.lease_renewed_at or r.updated_at)
    if silent <= policy.lease_ttl:
        return False, []  # held: renewed within its TTL
    code = ReasonCode.ROLLOUT_HOLDER_LOST
    text = (
        f"rollout holder {r.holder} stopped renewing the rollout lease "
        f"{silent.total_seconds():.0f}s ago (lease TTL {policy.lease_ttl.total_seconds():g}s); "
        f"{me} took the lease over: replicas of generations {r.from_generation} and "
        f"{r.generation} may both be serving; submit a new rollout"
    )
    return True, [take, *phase_change(group, r, RolloutPhase.FAILED, code, text)]


# --- batches ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ranks:
    """The live tasks of each rank, split by generation."""

    new: dict[int, Task]  # newest live task of the rollout's generation
    old: dict[int, list[Task]]  # live tasks of any other generation

    @classmethod
    def of(cls, tasks: Sequence[Task], generation: int) -> Ranks:
        new: dict[int, Task] = {}
        old: dict[int, list[Task]] = {}
        for t in sorted(tasks, key=lambda t: (t.created_at, t.id)):
            if t.rank is None or t.status in TERMINAL:
                continue
            if t.generation == generation:
                new[t.rank] = t
            else:
                old.setdefault(t.rank, []).append(t)
        return cls(new, old)

    def replaced(self, rank: int) -> bool:
        return rank in self.new and not self.old.get(rank)

    def serving_old(self, rank: int) -> bool:
        return any(not t.draining for t in self.old.get(rank, []))


def plan_rollout(
    group: Group,
    tasks: Sequence[Task],
    now: datetime,
    healthy: frozenset[str],
    drained: frozenset[str],
    policy: RolloutPolicy,
) -> RolloutStep:
    """The next step of the group's rollout (its lease already ours)."""
    r = group.rollout
    if r is None or group.deleted_at is not None:
        return RolloutStep()
    ranks = Ranks.of(tasks, r.generation)
    if r.phase is RolloutPhase.RUNNING:
        return _running(group, r, ranks, now, healthy, drained, policy)
    if r.phase is RolloutPhase.ROLLBACK:
        return _rollback(group, r, ranks)
    return RolloutStep()  # paused, or ended


def _running(
    group: Group,
    r: Rollout,
    ranks: Ranks,
    now: datetime,
    healthy: frozenset[str],
    drained: frozenset[str],
    policy: RolloutPolicy,
) -> RolloutStep:
    cur = r.current
    if cur is None:
        return _next_batch(group, r, ranks)
    if cur.step is BatchStep.DOWN:
        return _take_down(group, r, cur, ranks, now, drained, policy)
    if cur.step is BatchStep.STARTED:
        return _await_health(group, r, cur, ranks, now, healthy)
    if cur.step is BatchStep.FAILED:
        return _after_failure(group, r, cur, ranks, policy)
    return _drain(group, r, cur, ranks, now, drained, policy)


def _next_batch(group: Group, r: Rollout, ranks: Ranks) -> RolloutStep:
    partition = r.request.partition
    limit = group.size if partition is None else min(partition, group.size)
    todo = [k for k in range(limit) if not ranks.replaced(k)]
    if not todo:
        if limit < group.size:
            return RolloutStep()  # canary: held at its partition until raised
        code = ReasonCode.ROLLOUT_COMPLETED
        text = f"all {group.size} replica(s) run generation {r.generation}"
        return RolloutStep(events=phase_change(group, r, RolloutPhase.COMPLETED, code, text))
    batch = tuple(todo[: batch_width(r, group.size)])
    number = max((b.number for b in r.batches), default=0) + 1
    return _start(group, r, batch, number, 1, ranks)


def _start(
    group: Group, r: Rollout, batch: tuple[int, ...], number: int, attempt: int, ranks: Ranks
) -> RolloutStep:
    """Begin an attempt: take the old replicas of the down ranks out of service first when
    any is live, else create the batch's new replicas."""
    down = [t for k in down_ranks(r, batch) for t in ranks.old.get(k, [])]
    if down:
        record = _record(group, r, number, attempt, BatchStep.DOWN, batch, [t.id for t in down])
        drain: list[str] = [t.id for t in down if t.status is S.RUNNING and not t.draining]
        return RolloutStep(events=[record], drain=drain)
    record = _record(group, r, number, attempt, BatchStep.STARTED, batch)
    return RolloutStep(events=[record], create=[k for k in batch if k not in ranks.new])


def _take_down(
    group: Group,
    r: Rollout,
    cur: BatchRecord,
    ranks: Ranks,
    now: datetime,
    drained: frozenset[str],
    policy: RolloutPolicy,
) -> RolloutStep:
    """The down ranks' old replicas drain and end; once none is live, the batch starts."""
    old = [t for k in down_ranks(r, cur.ranks) for t in ranks.old.get(k, [])]
    if not old:
        return _start(group, r, cur.ranks, cur.number, cur.attempt, ranks)
    end, drain = _ends(old, now - cur.at, drained, policy)
    return RolloutStep(end=end, drain=drain)


def _await_health(
    group: Group, r: Rollout, cur: BatchRecord, ranks: Ranks, now: datetime, healthy: frozenset[str]
) -> RolloutStep:
    new = [ranks.new.get(k) for k in cur.ranks]
    dead = [k for k, t in zip(cur.ranks, new, strict=True) if t is None]
    if dead:
        why = f"new replica(s) of rank(s) {dead} ended before becoming healthy"
        return _fail_batch(group, r, cur, ranks, why)
    live = [t for t in new if t is not None]
    if all(t.status is S.RUNNING and t.id in healthy for t in live):
        step = _record(group, r, cur.number, cur.attempt, BatchStep.READY, cur.ranks)
        old = [t for k in cur.ranks for t in ranks.old.get(k, []) if not t.draining]
        drain = _record(
            group, r, cur.number, cur.attempt, BatchStep.DRAIN, cur.ranks, [t.id for t in old]
        )
        return RolloutStep(events=[step, drain], drain=[t.id for t in old])
    # A pause stops the clock: the timeout restarts from the resume (docs/rollout.md).
    since = max(cur.at, r.resumed_at) if r.resumed_at is not None else cur.at
    waited = now - since
    timeout = timedelta(seconds=r.request.health_timeout_s)
    if waited > timeout:
        slow = [t.rank for t in live if not (t.status is S.RUNNING and t.id in healthy)]
        why = (
            f"new replica(s) of rank(s) {slow} not running and healthy within "
            f"{r.request.health_timeout_s}s"
        )
        return _fail_batch(group, r, cur, ranks, why)
    return RolloutStep()


def _fail_batch(group: Group, r: Rollout, cur: BatchRecord, ranks: Ranks, why: str) -> RolloutStep:
    stop: list[str] = [ranks.new[k].id for k in cur.ranks if k in ranks.new]
    record = _record(group, r, cur.number, cur.attempt, BatchStep.FAILED, cur.ranks, stop, why)
    return RolloutStep(events=[record], stop=stop)


def _after_failure(
    group: Group, r: Rollout, cur: BatchRecord, ranks: Ranks, policy: RolloutPolicy
) -> RolloutStep:
    left = [ranks.new[k] for k in cur.ranks if k in ranks.new]
    if left:
        # The failed attempt's replicas are still stopping (or one came back: a retry
        # requeued it); the next attempt waits until they are gone.
        return RolloutStep(stop=[t.id for t in left if t.status not in _ENDING])
    if cur.attempt <= policy.batch_retries:
        return _start(group, r, cur.ranks, cur.number, cur.attempt + 1, ranks)
    code = ReasonCode.ROLLOUT_BATCH_FAILED
    text = f"batch {cur.number} failed {cur.attempt} time(s): {cur.reason}; rolling back"
    return RolloutStep(events=phase_change(group, r, RolloutPhase.ROLLBACK, code, text))


def _drain(
    group: Group,
    r: Rollout,
    cur: BatchRecord,
    ranks: Ranks,
    now: datetime,
    drained: frozenset[str],
    policy: RolloutPolicy,
) -> RolloutStep:
    old = [t for k in cur.ranks for t in ranks.old.get(k, [])]
    if not old:
        done = _record(group, r, cur.number, cur.attempt, BatchStep.DONE, cur.ranks)
        return RolloutStep(events=[done])
    end, drain = _ends(old, now - cur.at, drained, policy)
    return RolloutStep(end=end, drain=drain)


def _ends(
    old: Sequence[Task], waited: timedelta, drained: frozenset[str], policy: RolloutPolicy
) -> tuple[list[str], list[str]]:
    """(end, drain) for old replicas marked draining `waited` ago: a running one ends once
    the routers report nothing in flight on it (or the drain timeout passed)."""
    end: list[str] = []
    # Marked again if the mark did not land (the controller stopped between the batch
    # record and the marks): marking twice changes nothing.
    drain: list[str] = [t.id for t in old if not t.draining and t.status is S.RUNNING]
    for t in old:
        if t.status in _ENDING:
            continue  # on its way out
        if t.status not in _DRAINABLE:
            end.append(t.id)  # never served: nothing to wait for
        elif waited >= policy.drain_timeout or (waited >= policy.drain_min and t.id in drained):
            end.append(t.id)
    return end, drain


def _rollback(group: Group, r: Rollout, ranks: Ranks) -> RolloutStep:
    """Stop the new generation; rebuild the old configuration where no old replica serves."""
    out = RolloutStep()
    out.stop = [t.id for t in ranks.new.values() if t.status not in _ENDING]
    missing = [k for k in range(group.size) if not ranks.serving_old(k)]
    out.end = [
        t.id
        for k in range(group.size)
        for t in ranks.old.get(k, [])
        if t.draining and t.status not in _ENDING
    ]
    if missing:
        number = max((b.number for b in r.batches), default=0) + 1
        out.restore = missing
        out.events.append(_record(group, r, number, 1, BatchStep.RESTORED, tuple(missing)))
        return out
    if not ranks.new:
        failed = r.reason_code is ReasonCode.ROLLOUT_BATCH_FAILED
        to = RolloutPhase.FAILED if failed else RolloutPhase.ROLLED_BACK
        code = ReasonCode.ROLLOUT_BATCH_FAILED if failed else ReasonCode.ROLLOUT_ROLLED_BACK
        text = r.reason if failed else f"rolled back to generation {r.from_generation}'s config"
        out.events.extend(phase_change(group, r, to, code, text))
    return out


def _record(
    group: Group,
    r: Rollout,
    number: int,
    attempt: int,
    step: BatchStep,
    ranks: tuple[int, ...],
    task_ids: Sequence[str] = (),
    reason: str = "",
) -> RolloutBatchRecorded:
    return RolloutBatchRecorded(
        group_id=group.id,
        rollout_id=r.id,
        number=number,
        attempt=attempt,
        step=step,
        ranks=ranks,
        task_ids=tuple(task_ids),
        reason=reason,
    )


def phase_change(
    group: Group, r: Rollout, to: RolloutPhase, code: ReasonCode, text: str
) -> list[Payload]:
    """The phase change, and the group's own status where seed 000 gives it one."""
    changed = RolloutPhaseChanged(
        group_id=group.id,
        rollout_id=r.id,
        from_phase=r.phase,
        to_phase=to,
        reason_code=code,
        reason=text,
    )
    return [changed, *group_status_for(group, to, code, text)]


# The group's status while its rollout restores the old configuration, and at the end of a
# rollout that failed (seed 000, 滚动更新: "状态置 rollback", "组置 failed"). A requested
# rollback that finished, or a completed rollout, leaves the status to the members again.
_GROUP_STATUS = {
    RolloutPhase.ROLLBACK: GroupStatus.ROLLBACK,
    RolloutPhase.FAILED: GroupStatus.FAILED,
}


def group_status_for(
    group: Group, to: RolloutPhase, code: ReasonCode, text: str
) -> list[GroupStatusChanged]:
    status = _GROUP_STATUS.get(to)
    if status is None or status is group.status:
        return []
    return [
        GroupStatusChanged(
            group_id=group.id,
            from_status=group.status,
            to_status=status,
            reason_code=code,
            reason=text,
        )
    ]
