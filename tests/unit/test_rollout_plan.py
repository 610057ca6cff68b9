"""The rollout batch planner (pure): batches, surge, health timeout, retries, rollback,
canary partition, drain waits and the group's rollout lease, against a simulated group."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from libs.domain.errors import Code, DomainError
from libs.domain.group.decide import GroupPolicy, decide_group
from libs.domain.group.events import GroupStatusChanged
from libs.domain.group.evolve import evolve_group
from libs.domain.group.model import Group, GroupSpec, GroupStatus, current_members, parse_group
from libs.domain.reasons import ReasonCode
from libs.domain.rollout.decide import decide_action, decide_start
from libs.domain.rollout.events import (
    RolloutLeaseReleased,
    RolloutLeaseRenewed,
    RolloutPhaseChanged,
)
from libs.domain.rollout.model import BatchStep, RolloutPhase
from libs.domain.rollout.plan import (
    RolloutPolicy,
    RolloutStep,
    decide_lease,
    plan_rollout,
    replica_spec,
    surge_cards,
)
from libs.domain.task.model import Task, TaskId, TenantId
from libs.domain.task.states import TERMINAL, TaskStatus

S = TaskStatus
T0 = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = RolloutPolicy(batch_retries=3)


def spec(**kw: Any) -> GroupSpec:
    body = {"name": "web", "image": "v1", "task_count": 3, "task_type": "inference"} | kw
    return parse_group(body, tenant=True)


@dataclass
class Sim:
    """A group and its tasks; replicas start, pass health and drain as the test says."""

    group: Group
    tasks: dict[str, Task] = field(default_factory=dict)
    now: datetime = T0
    healthy_when: Callable[[Task], bool] = lambda t: True
    in_flight: set[str] = field(default_factory=set)
    seq: int = 0
    most_live: int = 0
    least_serving: int = 1 << 30  # replicas running, healthy and not draining, at the worst
    group_statuses: list[GroupStatus] = field(default_factory=list)

    @classmethod
    def of(cls, gspec: GroupSpec, **kw: Any) -> Sim:
        g = Group(id="g", tenant_id=TenantId("a"), spec=gspec, created_at=T0, updated_at=T0)
        sim = cls(g, **kw)
        for rank in range(gspec.shape.task_count):
            sim.add(gspec.member_spec(rank), rank, 0, S.RUNNING)
        return sim

    def add(self, tspec: Any, rank: int, generation: int, status: TaskStatus) -> Task:
        self.seq += 1
        t = Task(
            id=TaskId(f"t{self.seq}"),
            tenant_id=TenantId("a"),
            spec=tspec,
            status=status,
            group_id="g",
            rank=rank,
            generation=generation,
            node_id="n1",
            created_at=self.now + timedelta(microseconds=self.seq),
            updated_at=self.now,
        )
        self.tasks[t.id] = t
        return t

    def emit(self, events: list[Any]) -> None:
        for ev in events:
            self.group = evolve_group(self.group, ev, self.now, self.group.version + 1)

    def start(self, **body: Any) -> None:
        self.emit(list(decide_start(self.group, body, "ro-1")))

    def set(self, task_id: str, **update: Any) -> None:
        self.tasks[task_id] = self.tasks[task_id].model_copy(update=update)

    def live(self) -> list[Task]:
        return [t for t in self.tasks.values() if t.status not in TERMINAL]

    def step(self) -> RolloutStep:
        """One controller pass, then the agents' part (new replicas run; ends take effect)."""
        healthy = frozenset(t.id for t in self.tasks.values() if self.healthy_when(t))
        drained = frozenset(t.id for t in self.tasks.values() if t.id not in self.in_flight)
        step = plan_rollout(
            self.group, list(self.tasks.values()), self.now, healthy, drained, POLICY
        )
        r = self.group.rollout
        assert r is not None
        self.emit(step.events)
        for k in step.create:
            spec_k = replica_spec(self.group, r.target, k, surge_cards(r, self.group.size))
            self.add(spec_k, k, r.generation, S.RUNNING)
        for k in step.restore:
            self.add(replica_spec(self.group, r.previous, k), k, r.from_generation, S.RUNNING)
        self.most_live = max(self.most_live, len(self.live()))
        for tid in step.drain:
            self.set(tid, draining=True)
        for tid in step.end:
            self.set(tid, status=S.CANCELLED)  # running → draining → cancelled (agent)
        for tid in step.stop:
            self.set(tid, status=S.STOPPED)
        serving = [
            t for t in self.live() if t.status is S.RUNNING and not t.draining and t.id in healthy
        ]
        self.least_serving = min(self.least_serving, len(serving))
        if not self.group_statuses or self.group_statuses[-1] is not self.group.status:
            self.group_statuses.append(self.group.status)
        return step

    def run(self, passes: int = 60, tick: timedelta = timedelta(seconds=1)) -> None:
        for _ in range(passes):
            self.now += tick
            self.step()
            rollout = self.group.rollout
            if rollout is None or rollout.phase not in (
                RolloutPhase.RUNNING,
                RolloutPhase.ROLLBACK,
            ):
                return

    def images(self) -> list[str]:
        return sorted(t.spec.image for t in self.live())

    def steps(self) -> list[tuple[int, int, str]]:
        r = self.group.rollout
        assert r is not None
        return [(b.number, b.attempt, b.step.value) for b in r.batches]


@pytest.mark.parametrize(
    ("surge", "most_live"),
    [(1, 4), (2, 5), (3, 6)],
    ids=["surge-1", "surge-2", "surge-3"],
)
def test_a_full_rollout_replaces_every_replica_within_the_surge(surge: int, most_live: int) -> None:
    sim = Sim.of(spec())
    sim.start(image="v2", max_surge=surge)
    sim.run()
    r = sim.group.rollout
    assert r is not None and r.phase is RolloutPhase.COMPLETED
    assert sim.images() == ["v2", "v2", "v2"]
    assert sim.most_live == most_live  # never more than max_surge extra replicas
    old = [t for t in sim.tasks.values() if t.generation == 0]
    assert {t.status for t in old} == {S.CANCELLED}  # never completed
    assert sim.group.spec.template.image == "v2"  # self-heal builds the new config now
    assert [m.generation for m in current_members(list(sim.tasks.values()))] == [1, 1, 1]


def test_batches_go_in_rank_order_and_each_is_recorded() -> None:
    sim = Sim.of(spec())
    sim.start(image="v2")
    sim.run()
    assert sim.steps() == [
        (n, 1, s) for n in (1, 2, 3) for s in ("started", "ready", "drain", "done")
    ]
    r = sim.group.rollout
    assert r is not None and [b.ranks for b in r.batches if b.step is BatchStep.STARTED] == [
        (0,),
        (1,),
        (2,),
    ]


def test_an_old_replica_waits_for_its_in_flight_requests_up_to_the_drain_timeout() -> None:
    sim = Sim.of(spec(task_count=1))
    sim.start(image="v2")
    old = next(iter(sim.tasks))
    sim.in_flight.add(old)
    for _ in range(3):
        sim.now += timedelta(seconds=1)
        sim.step()
    assert sim.tasks[old].draining and sim.tasks[old].status is S.RUNNING
    for _ in range(14):  # 15 s after the drain began, it ends even with requests in flight
        sim.now += timedelta(seconds=1)
        sim.step()
    assert sim.tasks[old].status is S.CANCELLED


def test_a_drained_replica_ends_once_the_routers_count_nothing_in_flight() -> None:
    sim = Sim.of(spec(task_count=1))
    sim.start(image="v2")
    old = next(iter(sim.tasks))
    sim.in_flight.add(old)
    for _ in range(4):
        sim.now += timedelta(seconds=1)
        sim.step()
    assert sim.tasks[old].status is S.RUNNING
    sim.in_flight.clear()
    sim.now += timedelta(seconds=1)
    assert sim.step().end == [old]


def test_canary_partition_updates_only_the_first_ranks_until_raised() -> None:
    sim = Sim.of(spec())
    sim.start(image="v2", partition=1)
    sim.run(passes=20)
    r = sim.group.rollout
    assert r is not None and r.phase is RolloutPhase.RUNNING  # held at the partition
    by_rank = {m.rank: m.spec.image for m in current_members(list(sim.tasks.values()))}
    assert by_rank == {0: "v2", 1: "v1", 2: "v1"}
    sim.emit(list(decide_start(sim.group, {"partition": 3}, "ro-2")))
    sim.run()
    r = sim.group.rollout
    assert r is not None and r.phase is RolloutPhase.COMPLETED and r.id == "ro-1"
    assert sim.images() == ["v2", "v2", "v2"]


def test_a_batch_never_healthy_is_retried_then_rolled_back_and_the_rollout_fails() -> None:
    sim = Sim.of(spec(), healthy_when=lambda t: t.spec.image != "v2")
    sim.start(image="v2", health_timeout_s=5)
    old = {t.id for t in sim.tasks.values()}
    sim.run(passes=200)
    r = sim.group.rollout
    assert r is not None and r.phase is RolloutPhase.FAILED
    assert (
        r.reason_code is ReasonCode.ROLLOUT_BATCH_FAILED and "not running and healthy" in r.reason
    )
    failed = [b for b in r.batches if b.step is BatchStep.FAILED]
    assert [b.attempt for b in failed] == [1, 2, 3, 4]  # first try + 3 retries, one batch
    assert {b.number for b in failed} == {1}
    # The old replicas were never touched: v1 served throughout.
    assert all(sim.tasks[t].status is S.RUNNING and not sim.tasks[t].draining for t in old)
    assert sim.images() == ["v1", "v1", "v1"]
    assert {t.status for t in sim.tasks.values() if t.generation == 1} == {S.STOPPED}
    # The group itself: `rollback` while restoring, `failed` with the reason at the end.
    assert sim.group_statuses[-2:] == [GroupStatus.ROLLBACK, GroupStatus.FAILED]
    assert sim.group.reason_code is ReasonCode.ROLLOUT_BATCH_FAILED
    assert sim.group.reason == r.reason


def test_the_group_failed_by_its_rollout_stays_failed_while_v1_serves() -> None:
    sim = Sim.of(spec(), healthy_when=lambda t: t.spec.image != "v2")
    sim.start(image="v2", health_timeout_s=5)
    sim.run(passes=200)
    assert sim.group.status is GroupStatus.FAILED
    acts = decide_group(
        sim.group, list(sim.tasks.values()), sim.now, GroupPolicy(), lambda t: False
    )
    assert acts.empty  # not flipped back to running by the members' aggregate, nothing stopped
    sim.start(image="v3")  # the next rollout ...
    sim.run()
    assert sim.group.rollout is not None and sim.group.rollout.phase is RolloutPhase.COMPLETED
    acts = decide_group(
        sim.group, list(sim.tasks.values()), sim.now, GroupPolicy(), lambda t: False
    )
    assert [getattr(e, "to_status", None) for e in acts.events] == [GroupStatus.RUNNING]


def test_a_new_replica_that_dies_fails_its_batch_at_once() -> None:
    sim = Sim.of(spec(task_count=1), healthy_when=lambda t: False)
    sim.start(image="v2")
    sim.now += timedelta(seconds=1)
    sim.step()
    new = next(t for t in sim.tasks.values() if t.generation == 1)
    sim.set(new.id, status=S.FAILED)
    sim.now += timedelta(seconds=1)
    step = sim.step()
    assert [type(e).__name__ for e in step.events] == ["RolloutBatchRecorded"]
    assert sim.steps()[-1] == (1, 1, "failed")


def test_a_requested_rollback_restores_replaced_ranks_with_the_old_configuration() -> None:
    sim = Sim.of(spec())
    sim.start(image="v2")
    for _ in range(5):  # batch 1 done: rank 0 runs v2, its v1 replica is cancelled
        sim.now += timedelta(seconds=1)
        sim.step()
    assert sorted(sim.images()) == ["v1", "v1", "v2"]
    r = sim.group.rollout
    assert r is not None
    sim.emit(
        [
            RolloutPhaseChanged(
                group_id="g",
                rollout_id=r.id,
                from_phase=r.phase,
                to_phase=RolloutPhase.ROLLBACK,
                reason_code=ReasonCode.ROLLOUT_ACTION,
                reason="rollback requested",
            )
        ]
    )
    sim.run()
    r = sim.group.rollout
    assert r is not None and r.phase is RolloutPhase.ROLLED_BACK
    assert sim.images() == ["v1", "v1", "v1"]
    assert GroupStatus.FAILED not in sim.group_statuses  # a requested rollback is no failure
    restored = [t for t in sim.live() if t.rank == 0]
    assert [t.generation for t in restored] == [0]
    assert sim.group.spec.template.image == "v1"


@pytest.mark.parametrize(
    ("surge", "unavailable", "most_live", "least_serving", "batches"),
    [(0, 1, 3, 2, 3), (0, 2, 3, 1, 2), (1, 1, 4, 2, 2), (2, 1, 5, 2, 1)],
    ids=["surge-0-unavail-1", "surge-0-unavail-2", "surge-1-unavail-1", "surge-2-unavail-1"],
)
def test_max_unavailable_takes_old_replicas_out_before_their_replacements(
    surge: int, unavailable: int, most_live: int, least_serving: int, batches: int
) -> None:
    sim = Sim.of(spec())
    sim.start(image="v2", max_surge=surge, max_unavailable=unavailable)
    sim.run(passes=120)
    r = sim.group.rollout
    assert r is not None and r.phase is RolloutPhase.COMPLETED
    assert sim.images() == ["v2", "v2", "v2"]
    assert sim.most_live == most_live  # at most max_surge beyond the group's size
    assert sim.least_serving == least_serving  # at most max_unavailable out of service
    assert max(b.number for b in r.batches) == batches
    down = [b for b in r.batches if b.step is BatchStep.DOWN]
    assert down and all(len(b.task_ids) <= unavailable for b in down)
    old = [t for t in sim.tasks.values() if t.generation == 0]
    assert {t.status for t in old} == {S.CANCELLED}


def test_a_down_rank_gets_its_replacement_only_once_its_old_replica_has_ended() -> None:
    sim = Sim.of(spec(task_count=1))
    sim.start(image="v2", max_surge=0, max_unavailable=1)
    (old,) = sim.tasks
    sim.in_flight.add(old)
    for _ in range(5):
        sim.now += timedelta(seconds=1)
        step = sim.step()
        assert not step.create
    assert sim.tasks[old].draining and sim.tasks[old].status is S.RUNNING
    sim.in_flight.clear()
    sim.now += timedelta(seconds=1)
    assert sim.step().end == [old]
    sim.now += timedelta(seconds=1)
    assert sim.step().create == [0]
    assert sim.steps()[:2] == [(1, 1, "down"), (1, 1, "started")]


def test_a_pause_stops_the_health_clock_and_a_resume_restarts_it() -> None:
    sim = Sim.of(spec(task_count=1), healthy_when=lambda t: False)
    sim.start(image="v2", health_timeout_s=5)
    for _ in range(3):
        sim.now += timedelta(seconds=1)
        sim.step()
    sim.emit(decide_action(sim.group, "pause"))
    for _ in range(10):  # paused far past the health timeout
        sim.now += timedelta(seconds=1)
        assert sim.step().empty
    sim.emit(decide_action(sim.group, "resume"))
    for _ in range(5):  # the timeout counts again from the resume: 5 s
        sim.now += timedelta(seconds=1)
        sim.step()
        assert sim.steps()[-1] == (1, 1, "started")
    sim.now += timedelta(seconds=1)
    sim.step()
    assert sim.steps()[-1] == (1, 1, "failed")


def test_a_paused_rollout_does_nothing() -> None:
    sim = Sim.of(spec())
    sim.start(image="v2")
    r = sim.group.rollout
    assert r is not None
    sim.group = sim.group.model_copy(
        update={"rollout": r.model_copy(update={"phase": RolloutPhase.PAUSED})}
    )
    assert sim.step().empty


def test_new_replicas_keep_the_users_intent_and_carry_the_surge_allowance() -> None:
    g = spec(env={"WORLD_SIZE": "mine", "MODEL": "/m"}, gpu_required=2, priority=30)
    sim = Sim.of(g)
    sim.start(image="v2", max_surge=2)
    r = sim.group.rollout
    assert r is not None
    new = replica_spec(sim.group, r.target, 1, 4)
    assert new.image == "v2" and new.priority == 30 and new.gpu_required == 2
    assert new.env == {"WORLD_SIZE": "mine", "MODEL": "/m"}  # the user's own variable stays
    # The allowance is the platform's (server-owned), never a label a tenant could write.
    assert new.platform.surge_cards == 4 and new.labels == {}
    sim.step()
    created = [t for t in sim.tasks.values() if t.generation == 1]
    assert created and all(t.spec.platform.surge_cards == 4 for t in created)  # 2 × 2 cards


def test_the_rollout_lease_is_taken_renewed_and_recovered_from_a_dead_holder() -> None:
    sim = Sim.of(spec())
    sim.start(image="v2")
    ours, events = decide_lease(sim.group, "me", T0, POLICY)
    assert ours and [type(e).__name__ for e in events] == ["RolloutLeaseRenewed"]
    sim.emit(events)
    assert decide_lease(sim.group, "me", T0 + timedelta(seconds=5), POLICY) == (True, [])
    ours, events = decide_lease(sim.group, "me", T0 + timedelta(seconds=16), POLICY)
    assert ours and len(events) == 1
    # Another instance: a lease renewed within its TTL (60 s) is held, past it expired.
    assert decide_lease(sim.group, "other", T0 + timedelta(seconds=60), POLICY) == (False, [])
    ours, events = decide_lease(sim.group, "other", T0 + timedelta(seconds=61), POLICY)
    assert ours
    took, ev, status = events
    assert isinstance(took, RolloutLeaseRenewed) and took.holder == "other"
    assert isinstance(ev, RolloutPhaseChanged) and ev.to_phase is RolloutPhase.FAILED
    assert ev.reason_code is ReasonCode.ROLLOUT_HOLDER_LOST and "submit a new rollout" in ev.reason
    assert "lease TTL 60s" in ev.reason and "other took the lease over" in ev.reason
    # The group itself is failed with the reason (issue 14: "marks the group failed").
    assert isinstance(status, GroupStatusChanged) and status.to_status is GroupStatus.FAILED
    sim.emit(events)
    assert sim.group.status is GroupStatus.FAILED
    assert sim.group.reason_code is ReasonCode.ROLLOUT_HOLDER_LOST
    r = sim.group.rollout
    assert r is not None and r.holder == "other" and r.phase is RolloutPhase.FAILED
    sim.emit(list(decide_start(sim.group, {"image": "v3"}, "ro-3")))  # a new rollout is accepted
    assert sim.group.rollout is not None and sim.group.rollout.generation == 2


@dataclass
class Clock:
    now: datetime = T0

    def tick(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


def run_leases(
    sim: Sim, clock: Clock, policy: RolloutPolicy, holder_dies_at: timedelta, until: timedelta
) -> datetime | None:
    """Two instances each pass every second on `clock`: "a" holds the lease and renews it
    until it dies at `holder_dies_at`; "b" passes too. When "b" took the lease over."""
    while clock.now - T0 < until:
        for me in ("a", "b"):
            if me == "a" and clock.now - T0 >= holder_dies_at:
                continue
            sim.now = clock.now
            ours, events = decide_lease(sim.group, me, clock.now, policy)
            sim.emit(events)
            if me == "b" and ours:
                return clock.now
        clock.tick(1)
    return None


@pytest.mark.parametrize(("ttl", "renew"), [(60, 15), (20, 5), (5, 1)])
def test_a_crashed_holders_lease_expires_after_its_ttl_and_is_taken_over(
    ttl: int, renew: int
) -> None:
    policy = RolloutPolicy(lease_ttl=timedelta(seconds=ttl), lease_renew=timedelta(seconds=renew))
    sim = Sim.of(spec())
    sim.start(image="v2")
    clock = Clock()
    # A live holder renewing every `renew` is never taken over (ten TTLs of passes).
    assert run_leases(sim, clock, policy, timedelta(days=1), timedelta(seconds=10 * ttl)) is None
    r = sim.group.rollout
    assert r is not None and r.holder == "a" and r.phase is RolloutPhase.RUNNING
    # It dies: "b" takes the lease over once the TTL from its last renewal has passed, at
    # the latest one pass (1 s) after TTL from the death, never before TTL − renew.
    died = clock.now - T0
    last = r.lease_renewed_at
    assert last is not None
    took = run_leases(sim, clock, policy, died, died + timedelta(seconds=10 * ttl))
    assert took is not None
    assert took - last > timedelta(seconds=ttl)
    assert timedelta(seconds=ttl - renew) < took - (T0 + died) <= timedelta(seconds=ttl + 1)
    r = sim.group.rollout
    assert r is not None and r.holder == "b" and r.phase is RolloutPhase.FAILED
    assert r.reason_code is ReasonCode.ROLLOUT_HOLDER_LOST


def test_the_lease_must_be_renewed_within_its_ttl() -> None:
    with pytest.raises(ValueError, match="must be shorter than its TTL"):
        RolloutPolicy(lease_ttl=timedelta(seconds=15), lease_renew=timedelta(seconds=15))


def test_a_released_lease_is_taken_at_once_by_the_next_holder() -> None:
    sim = Sim.of(spec())
    sim.start(image="v2")
    sim.emit(decide_lease(sim.group, "me", T0, POLICY)[1])
    r = sim.group.rollout
    assert r is not None and r.holder == "me"
    # A late release from an instance that no longer holds the lease changes nothing.
    sim.emit([RolloutLeaseReleased(group_id="g", rollout_id=r.id, holder="gone")])
    assert decide_lease(sim.group, "next", T0 + timedelta(seconds=5), POLICY) == (False, [])
    sim.emit([RolloutLeaseReleased(group_id="g", rollout_id=r.id, holder="me")])
    ours, events = decide_lease(sim.group, "next", T0 + timedelta(seconds=5), POLICY)
    assert ours and [type(e).__name__ for e in events] == ["RolloutLeaseRenewed"]
    sim.emit(events)
    r = sim.group.rollout
    assert r is not None and r.holder == "next" and r.phase is RolloutPhase.RUNNING


def test_current_members_prefer_the_live_task_of_a_rank() -> None:
    sim = Sim.of(spec(task_count=1))
    (old,) = sim.tasks.values()
    new = sim.add(old.spec, 0, 1, S.STOPPED)  # a newer, ended replica of the same rank
    assert current_members([old, new]) == [old]
    sim.set(old.id, status=S.CANCELLED)
    assert current_members([sim.tasks[old.id], new]) == [new]


def test_recreate_stops_the_old_world_before_starting_the_new_one() -> None:
    sim = Sim.of(spec(task_type="training", task_count=2, per_node_gpu=1))
    old = set(sim.tasks)
    sim.start(image="v2", strategy="recreate")
    sim.now += timedelta(seconds=1)
    step = sim.step()
    assert step.create == [] and sorted(step.drain) == sorted(old)  # the old world goes first
    for _ in range(20):
        if step.create:
            break
        sim.now += timedelta(seconds=1)
        step = sim.step()
    # Nothing new until every old member has ended (the world is fixed: two would clash).
    assert step.create == [0, 1]
    assert all(sim.tasks[t].status is S.CANCELLED for t in old)
    sim.run()
    r = sim.group.rollout
    assert r is not None and r.phase is RolloutPhase.COMPLETED
    assert sim.images() == ["v2", "v2"]
    assert sim.most_live == 2  # never both worlds at once
    created = [t for t in sim.tasks.values() if t.generation == 1]
    assert all(t.spec.platform.surge_cards == 0 for t in created)  # no surge: nothing overlaps


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"image": "Bad Image!"}, "image"),
        ({"image": "v2", "env": {"A": "x" * 70_000}}, "env"),
        ({"volumes": [{"host_path": "/data", "container_path": "/proc"}]}, "volumes"),
    ],
    ids=["image-reference", "env-limit", "container-path"],
)
def test_a_rollout_is_held_to_the_limits_of_a_created_task(
    body: dict[str, Any], field: str
) -> None:
    sim = Sim.of(spec())
    with pytest.raises(DomainError) as err:
        decide_start(sim.group, body, "ro-1")
    assert err.value.code is Code.INVALID_VALUE
    assert any(f.startswith(field) for f in err.value.fields), err.value.fields
