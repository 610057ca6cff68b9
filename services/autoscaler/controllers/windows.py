"""The schedule-window controller: leader-only, every `interval_s` (60 s by default).

Each pass asks `decide_window` (pure) what each windowed group needs at `clock()` (a wall
clock, injectable so tests cross midnight without waiting) and carries it out through the
term's writer (every write under its fence): the window event (its labels hold the action
and the count to restore) and, for a scale, the group_scaled event and the new members are
one transaction; member sleeps, wakes and stops follow in one batch.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import structlog

from libs.controller import Controller, Term, for_each
from libs.domain.group.model import Group, current_members, is_live
from libs.domain.group.scaling import ScalePlan, decide_scale
from libs.domain.group.window_control import WindowStep, decide_window
from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.task import decide as commands
from libs.domain.task.model import Task
from libs.domain.task.states import Actor, TaskStatus
from libs.store import groups as group_rows
from libs.store import tasks as task_rows
from libs.store.eventstore import EventStore, NewTask
from libs.store.fenced import FencedWriter
from libs.store.projections import GROUPS

log = structlog.get_logger(__name__)
S = TaskStatus
META = {"actor": "schedule_window"}


class WindowController(Controller):
    name = "schedule_windows"

    def __init__(
        self, store: EventStore, clock: Callable[[], datetime], *, interval_s: float = 60.0
    ) -> None:
        self.store = store
        self.clock = clock
        self.interval_s = interval_s

    async def evaluate(self, term: Term) -> None:
        await self.scan(term.writer)

    async def scan(self, out: FencedWriter) -> int:
        """One pass over every windowed group, writing through `out`: how many acted."""
        now = self.clock()
        groups = await group_rows.with_windows(self.store)
        done = await for_each(groups, lambda g: self.apply(g, now, out), "window_apply_failed")
        return sum(acted for _, acted in done)

    async def apply(self, group: Group, now: datetime, out: FencedWriter) -> int:
        step = decide_window(group, now)
        if step is None:
            return 0
        tasks = await task_rows.of_group(self.store, group.id, include_deleted=False)
        plan = ScalePlan()

        def decide(current: Group | None) -> tuple[list[Payload], list[NewTask]]:
            nonlocal plan
            if current is None or current.version != group.version:
                return [], []  # changed since we looked: the next pass decides again
            events: list[Payload] = [step.event]
            if step.replicas is not None and not current.spec.static_world:
                plan = decide_scale(
                    current,
                    tasks,
                    step.replicas,
                    source="schedule_window",
                    code=ReasonCode.SCHEDULE_WINDOW,
                    reason=step.event.reason,
                )
            if plan.event is not None:
                events.append(plan.event)
            return events, list(plan.new_members(current))

        await out.execute_with_tasks(GROUPS, group.id, decide, metadata=META)
        await self._move_members(step, plan, tasks, out)
        log.info("window_applied", group_id=group.id, action=step.action, replicas=step.replicas)
        return 1

    async def _move_members(
        self, step: WindowStep, plan: ScalePlan, tasks: list[Task], out: FencedWriter
    ) -> None:
        live = [m for m in current_members(tasks) if is_live(m)]
        why = step.event.reason
        decisions: dict[str, commands.Decide] = {}
        if plan.stop:
            decisions = {m.id: _stopper(why) for m in plan.stop}
        elif step.action == "stop" or (step.action == "scale" and step.replicas == 0):
            decisions = {m.id: _stopper(why) for m in live}  # static world scaled to 0
        elif step.action == "pause":
            decisions = {m.id: _sleeper(why) for m in live if m.status is S.RUNNING}
        elif step.action == "restore" and step.replicas is None:
            decisions = {m.id: _waker(why) for m in live if m.status is S.SLEEPING}
        if decisions:
            await out.execute_batch(decisions, metadata=META)


def _stopper(why: str) -> commands.Decide:
    def decide(t: Task) -> list[Any]:
        return list(commands.decide_stop(t, Actor.CONTROLLER, ReasonCode.SCHEDULE_WINDOW, why))

    return decide


def _sleeper(why: str) -> commands.Decide:
    def decide(t: Task) -> list[Any]:
        if t.status is not S.RUNNING:
            return []
        return list(
            commands.decide_transition(
                t,
                S.SLEEPING,
                actor=Actor.CONTROLLER,
                reason_code=ReasonCode.SCHEDULE_WINDOW,
                reason=why,
            )
        )

    return decide


def _waker(why: str) -> commands.Decide:
    def decide(t: Task) -> list[Any]:
        if t.status is not S.SLEEPING:
            return []
        return list(
            commands.decide_transition(
                t,
                S.WAKING,
                actor=Actor.CONTROLLER,
                expected_status=S.SLEEPING,
                reason_code=ReasonCode.SCHEDULE_WINDOW,
                reason=why,
            )
        )

    return decide
