"""Group controller (leader-only): aggregate member status and run group fault tolerance.

It runs on the controller runtime (libs/controller.py); every write goes through the term's
writer (`term.writer`), carrying its fence.

Every scan reads each live group with all its tasks, asks the pure `decide_group` what to do
and applies it: group events and new member rows in one transaction, then member
transitions with compare-and-set. A scan that finds nothing to do writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import structlog

from libs.controller import Controller, Term, for_each
from libs.domain.group.decide import GroupActions, GroupPolicy, decide_group
from libs.domain.group.model import GROUP_TERMINAL, Group
from libs.domain.payload import Payload
from libs.domain.reasons import INFRASTRUCTURE_REASONS, ReasonCode
from libs.domain.task import decide as commands
from libs.domain.task.failure import FailureClass, classify
from libs.domain.task.model import Task, TaskSpec
from libs.domain.task.states import Actor, TaskStatus
from libs.ownership import own_members
from libs.store import groups as group_rows
from libs.store import tasks as task_rows
from libs.store.eventstore import EventStore, NewTask
from libs.store.fenced import FencedWriter
from libs.store.projections import GROUPS

log = structlog.get_logger(__name__)

# Ended groups stay in the scan this long (a member's late failure still counts).
RECENT = timedelta(minutes=31)


def is_infra_failure(task: Task) -> bool:
    """Infrastructure, not the user's program: transient kinds, lost nodes or containers."""
    if task.status_reason_code in INFRASTRUCTURE_REASONS:
        return True
    kind, _, detail = task.error.partition(": ")
    failure = classify(
        exit_code=task.exit_code,
        error_kind=kind if detail else "",
        error=task.error,
        output=task.result,
    )
    return failure.cls is FailureClass.TRANSIENT


def member_task(group: Group, rank: int, priority: int | None) -> NewTask:
    spec: TaskSpec = group.spec.member_spec(rank)
    if priority is not None:
        spec = spec.model_copy(update={"priority": priority})
    return (group.tenant_id, spec, group.id, rank)


async def load_group_tasks(store: EventStore, group_id: str) -> list[Task]:
    return await task_rows.of_group(store, group_id)


class GroupController(Controller):
    """Status and replica self-heal every `interval_s`; inference rebuilds every
    `rebuild_every_s` (by the runtime's clock)."""

    name = "group_scan"

    def __init__(
        self,
        store: EventStore,
        policy: GroupPolicy,
        clock: Callable[[], datetime],
        *,
        interval_s: float = 2.0,
        rebuild_every_s: float = 10.0,
    ) -> None:
        self.store = store
        self.policy = policy
        self.clock = clock
        self.interval_s = interval_s
        self.rebuild_every_s = rebuild_every_s
        self.writer: FencedWriter | None = None  # the term's; none: the store's own (tests)
        self._last_rebuild: float | None = None

    async def elected(self, term: Term) -> None:
        await super().elected(term)
        self.writer = term.writer if term.store is not None else None
        self._last_rebuild = None

    @property
    def writes(self) -> FencedWriter | EventStore:
        return self.writer or self.store

    async def evaluate(self, term: Term) -> None:
        now = term.now()
        rebuild = self._last_rebuild is None or now - self._last_rebuild >= self.rebuild_every_s
        if rebuild:
            self._last_rebuild = now
        await self.scan(allow_rebuild=rebuild)

    async def scan(self, *, allow_rebuild: bool = False) -> int:
        groups = await group_rows.live_or_recent(self.store, GROUP_TERMINAL, RECENT)

        async def one(group: Group) -> int:
            return await self.reconcile(group, allow_rebuild=allow_rebuild)

        done = await for_each(groups, one, "group_reconcile_failed")
        return sum(acted for _, acted in done)

    async def reconcile(self, group: Group, *, allow_rebuild: bool = True) -> int:
        tasks = own_members(group, await load_group_tasks(self.store, group.id))
        now = self.clock()
        plan = decide_group(
            group, tasks, now, self.policy, is_infra_failure, allow_rebuild=allow_rebuild
        )
        if plan.empty:
            return 0
        if plan.events or plan.new_ranks:
            await self._record(group, plan, tasks)
        await self._move_members(plan)
        log.info(
            "group_reconciled",
            group_id=group.id,
            events=[e.type for e in plan.events],
            new_ranks=plan.new_ranks,
            stopped=len(plan.stop),
            failed=len(plan.fail),
        )
        return 1

    async def _record(self, seen: Group, plan: GroupActions, tasks: Sequence[Task]) -> None:
        def decide(current: Group | None) -> tuple[list[Payload], list[NewTask]]:
            if current is None or current.version != seen.version:
                return [], []  # changed since we looked: the next scan decides again
            new = [member_task(current, r, plan.priority) for r in plan.new_ranks]
            return list(plan.events), new

        await self.writes.execute_with_tasks(
            GROUPS,
            seen.id,
            decide,
            metadata={"actor": "group_controller"},
            generation=seen.generation,  # a replacement belongs to the group's generation
        )

    async def _move_members(self, plan: GroupActions) -> None:
        decisions: dict[str, commands.Decide] = {}
        for task_id in plan.stop:
            decisions[task_id] = _stop
        for task_id in plan.fail:
            decisions[task_id] = _fail
        if decisions:
            await self.writes.execute_batch(decisions, metadata={"actor": "group_controller"})


def _stop(t: Task) -> list[Any]:
    return list(commands.decide_stop(t, Actor.CONTROLLER, ReasonCode.GROUP_FAILED, "group failed"))


def _fail(t: Task) -> list[Any]:
    if t.status is not TaskStatus.PENDING:
        return _stop(t)
    return list(
        commands.decide_transition(
            t,
            TaskStatus.FAILED,
            actor=Actor.CONTROLLER,
            expected_status=TaskStatus.PENDING,
            reason_code=ReasonCode.GROUP_FAILED,
            reason="group failed",
            error="group failed before this member was placed",
        )
    )


def policy_from(
    backoffs_s: Sequence[float],
    window_s: float,
    give_up_s: float,
    max_rebuilds: int,
    *,
    replica_max_restarts: int = 5,
    replica_crash_window_s: float = 600.0,
    replica_backoff_s: float = 10.0,
    replica_backoff_max_s: float = 300.0,
) -> GroupPolicy:
    return GroupPolicy(
        restart_window=timedelta(seconds=window_s),
        restart_backoffs=tuple(timedelta(seconds=b) for b in backoffs_s),
        restart_give_up_after=timedelta(seconds=give_up_s),
        max_rebuilds=max_rebuilds,
        replica_max_restarts=replica_max_restarts,
        replica_crash_window=timedelta(seconds=replica_crash_window_s),
        replica_backoff=timedelta(seconds=replica_backoff_s),
        replica_backoff_max=timedelta(seconds=replica_backoff_max_s),
    )
