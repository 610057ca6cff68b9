"""The rollout controller: leader-only, one pass every `interval_s` over the groups whose
rollout is running, paused or rolling back.

For each group it first takes or renews the group's rollout lease (a `rollout_lease_renewed`
event, at most every `lease_renew`), or, when another holder's lease has expired (not
renewed for `lease_ttl`), takes it over and fails the rollout with the reason. Then it
asks the pure `plan_rollout` (libs/domain/rollout/plan.py) for the next step and carries it
out through the term's writer (every write under its fence):
the group events and the new replicas in one transaction (a compare-and-set on the group's
version: a group that moved since it was read is left to the next pass), then the replicas'
drain marks, ends and stops in one batch.

A graceful stop (SIGTERM, or a term that ends because the leadership lease was released or
lost) gives the group rollout leases this instance holds back (`rollout_lease_released`):
the next holder takes them at once and resumes each rollout from its durable state. Only a
holder that vanished without a word (SIGKILL, a lost host) waits out the lease's TTL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import structlog

from libs.controller import Controller, Term, for_each
from libs.domain.errors import Fenced
from libs.domain.group.model import Group
from libs.domain.group.router_figures import RouterFigures
from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.rollout.decide import decide_drain
from libs.domain.rollout.events import RolloutLeaseReleased
from libs.domain.rollout.model import ACTIVE, BatchStep
from libs.domain.rollout.plan import (
    RolloutPolicy,
    RolloutStep,
    decide_lease,
    plan_rollout,
    replica_spec,
    surge_cards,
)
from libs.domain.task import decide as commands
from libs.domain.task.model import Task, TenantId
from libs.domain.task.states import Actor, TaskStatus
from libs.ownership import own_members
from libs.store import groups as group_rows
from libs.store import tasks as task_rows
from libs.store.eventstore import EventStore, NewTask
from libs.store.fenced import FencedWriter
from libs.store.projections import GROUPS

from ..inflight import HealthProbe

log = structlog.get_logger(__name__)
S = TaskStatus
META = {"actor": "rollout"}
PHASES = tuple(p.value for p in ACTIVE)
RELEASE_TIMEOUT_S = 5.0  # a stopping instance gives its group leases back within this


class RolloutController(Controller):
    name = "rollout"

    def __init__(
        self,
        store: EventStore,
        clock: Callable[[], datetime],
        holder: str,
        policy: RolloutPolicy,
        inflight: RouterFigures,
        probe: HealthProbe,
        *,
        interval_s: float = 1.0,
    ) -> None:
        self.store = store
        self.clock = clock
        self.holder = holder
        self.policy = policy
        self.inflight = inflight
        self.probe = probe
        self.interval_s = interval_s
        self.out: FencedWriter | None = None  # the current term's writer

    async def elected(self, term: Term) -> None:
        await super().elected(term)
        self.out = term.writer

    async def evaluate(self, term: Term) -> None:
        await self.scan(term.writer)

    async def deposed(self) -> None:
        """The term ended (stopping, or leadership released or lost): hand every group
        rollout lease this instance holds over to the next holder. A write refused because a
        newer term already leads changes nothing: that leader then waits out the window."""
        out, self.out = self.out, None
        if out is None:
            return
        try:
            released = await asyncio.wait_for(self.release_leases(out), RELEASE_TIMEOUT_S)
            log.info("rollout_leases_released", holder=self.holder, groups=released)
        except Fenced:
            log.info("rollout_leases_not_released_fenced", holder=self.holder)
        except Exception:
            log.warning("rollout_leases_not_released", holder=self.holder, exc_info=True)

    async def release_leases(self, out: FencedWriter) -> list[str]:
        groups = await group_rows.with_active_rollout(self.store, PHASES)
        released: list[str] = []
        for group in groups:
            r = group.rollout
            if r is None or r.holder != self.holder:
                continue
            event = RolloutLeaseReleased(group_id=group.id, rollout_id=r.id, holder=self.holder)
            if await self._append(group, [event], [], 0, out) is not None:
                released.append(group.id)
        return released

    async def scan(self, out: FencedWriter) -> int:
        """One pass over the groups with an active rollout, writing through `out`: how many
        acted."""
        groups = await group_rows.with_active_rollout(self.store, PHASES)
        done = await for_each(groups, lambda g: self.reconcile(g, out), "rollout_reconcile_failed")
        return sum(acted for _, acted in done)

    async def reconcile(self, group: Group, out: FencedWriter) -> int:
        now = self.clock()
        ours, events = decide_lease(group, self.holder, now, self.policy)
        if events:
            moved = await self._append(group, events, [], 0, out)
            if moved is None:
                return 0
            group = moved
        r = group.rollout
        if not ours or r is None or r.phase not in ACTIVE:
            return 1 if events else 0
        tasks = own_members(
            group, await task_rows.of_group(self.store, group.id, include_deleted=False)
        )
        new = [t for t in tasks if t.generation == r.generation]
        healthy = await self.probe.healthy(new)
        step = plan_rollout(group, tasks, now, healthy, self._drained(group, tasks), self.policy)
        if step.empty:
            return 1 if events else 0
        await self.apply(group, step, out)
        return 1

    def _drained(self, group: Group, tasks: Sequence[Task]) -> frozenset[str]:
        """Draining replicas the routers know as draining with nothing in flight."""
        return frozenset(
            t.id
            for t in tasks
            if t.draining and t.status is S.RUNNING and self.inflight.drained(group.id, t.id)
        )

    async def apply(self, group: Group, step: RolloutStep, out: FencedWriter) -> None:
        r = group.rollout
        assert r is not None
        new: list[NewTask] = []
        generation = r.generation
        tenant = TenantId(group.tenant_id)
        if step.create:
            surge = surge_cards(r, group.size)
            new = [
                (tenant, replica_spec(group, r.target, k, surge), group.id, k) for k in step.create
            ]
        elif step.restore:
            generation = r.from_generation
            new = [(tenant, replica_spec(group, r.previous, k), group.id, k) for k in step.restore]
        written = not (step.events or new) or (
            await self._append(group, step.events, new, generation, out) is not None
        )
        if not written:
            return  # the group moved since it was read: the next pass plans again
        await self._move(step, out)
        log.info(
            "rollout_step",
            group_id=group.id,
            rollout_id=r.id,
            events=[_describe(e) for e in step.events],
            created=step.create,
            restored=step.restore,
            drained=len(step.drain),
            ended=len(step.end),
            stopped=len(step.stop),
        )

    async def _append(
        self,
        seen: Group,
        events: Sequence[Payload],
        new: Sequence[NewTask],
        generation: int,
        out: FencedWriter,
    ) -> Group | None:
        """Append and create in one transaction if the group is still as we read it."""
        moved = False

        def decide(current: Group | None) -> tuple[list[Payload], list[NewTask]]:
            nonlocal moved
            if current is None or current.version != seen.version:
                moved = True
                return [], []
            return list(events), list(new)

        group, _ = await out.execute_with_tasks(
            GROUPS, seen.id, decide, metadata=META, generation=generation
        )
        return None if moved else group

    async def _move(self, step: RolloutStep, out: FencedWriter) -> None:
        decisions: dict[str, commands.Decide] = {}
        for task_id in step.drain:
            decisions[task_id] = lambda t: list(decide_drain(t))
        for task_id in step.end:
            decisions[task_id] = _retire
        for task_id in step.stop:
            decisions[task_id] = _stop_new
        if decisions:
            await out.execute_batch(decisions, metadata=META)


def _describe(event: Payload) -> str:
    step = getattr(event, "step", None)
    if isinstance(step, BatchStep):
        return f"batch {getattr(event, 'number', '?')} {step.value}"
    return event.type


def _retire(t: Task) -> list[Any]:
    """An old replica replaced by the new generation ends `cancelled`, never `completed`: a
    running one goes `draining` (the agent stops it, its exit records cancelled), one that
    never ran is cancelled at once."""
    code = ReasonCode.ROLLOUT_REPLACED
    if t.status is S.RUNNING:
        return list(
            commands.decide_transition(
                t, S.DRAINING, actor=Actor.CONTROLLER, expected_status=S.RUNNING, reason_code=code
            )
        )
    # pending: cancelled; placed but not running: stopping (the agent may be starting it)
    return list(commands.decide_stop(t, Actor.CONTROLLER, code, code.text))


def _stop_new(t: Task) -> list[Any]:
    code = ReasonCode.ROLLOUT_STOPPED
    return list(commands.decide_stop(t, Actor.CONTROLLER, code, code.text))
