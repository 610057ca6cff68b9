"""The idle-sleep controller: leader-only, every `interval_s` (1 s by default), each serving
target with an idle timeout (docs/serving.md#idle-sleep).

A target (an inference group, or a task outside a group that declares `serving`) goes to
sleep once it has had no request for its `idle_timeout_minutes` (each minute
`serve_idle_minute_s` seconds, shortened in tests). `decide_idle_sleep`
(libs/domain/group/serving_control.py) judges it from the routers' figures on the bus (their last
request, or since when they watch a target that has had none; a request in flight or queued
at any router keeps it awake) and from when its newest running member became running: a
target no router reports is idle since then. Its running members go `sleeping` (reason
`idle_sleep`) in one batch through the term's writer.

Every instance listens to the figures; the controller acts only once its book has listened
`listen_s`, so a new leader does not take a target as idle for want of figures it has not
heard yet.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime

import structlog

from libs.controller import Controller, Term, for_each
from libs.domain.errors import NotFound
from libs.domain.group.router_figures import RouterFigures
from libs.domain.group.serving_control import (
    Idleness,
    decide_idle_sleep,
    serving_replicas,
    sleep_idle,
)
from libs.domain.task.events import TaskStatusChanged
from libs.domain.task.model import Task
from libs.domain.task.states import TaskStatus
from libs.store import groups as group_rows
from libs.store import tasks as task_rows
from libs.store.eventstore import EventStore
from libs.store.fenced import FencedWriter

log = structlog.get_logger(__name__)
S = TaskStatus
META = {"actor": "idle_sleep"}


class IdleSleeper(Controller):
    name = "idle_sleep"

    def __init__(
        self,
        store: EventStore,
        book: RouterFigures,
        clock: Callable[[], datetime],
        *,
        interval_s: float = 1.0,
        minute_s: float = 60.0,
        listen_s: float = 10.0,
    ) -> None:
        self.store = store
        self.book = book
        self.clock = clock
        self.interval_s = interval_s
        self.minute_s = minute_s
        self.listen_s = listen_s

    async def evaluate(self, term: Term) -> None:
        await self.scan(term.writer)

    async def scan(self, out: FencedWriter) -> list[str]:
        """One pass, writing through `out`: the targets put to sleep."""
        if self.book.listening_s() < self.listen_s:
            return []
        targets = await task_rows.serving_targets(self.store)
        done = await for_each(targets, lambda t: self.judge(t, out), "idle_sleep_failed")
        return [target for target, slept in done if slept]

    async def judge(self, target_id: str, out: FencedWriter) -> bool:
        """Sleep `target_id`'s running members if it is idle; whether it was."""
        timeout_minutes, members = await self._load(target_id)
        running = [m for m in members if m.status is S.RUNNING]
        view = Idleness(
            idle_timeout_s=timeout_minutes * self.minute_s,
            busy=self.book.busy(target_id),
            activity_s=self.book.activity_s(target_id),
            running_s=float("inf") if running else None,
        )
        if not decide_idle_sleep(view):
            return False  # idle by the figures alone first: the starts are read only then
        view = replace(view, running_s=await self._running_s(running))
        if not decide_idle_sleep(view):
            return False
        done, _ = await out.execute_batch({m.id: sleep_idle for m in running}, metadata=META)
        log.info("serving_idle_sleep", target=target_id, tasks=sorted(done), idle_s=view.idle_s)
        return bool(done)

    async def _load(self, target_id: str) -> tuple[int, list[Task]]:
        """The target's idle timeout (the group template's for a group) and replicas."""
        if target_id.startswith("grp-"):
            group = await group_rows.get(self.store, target_id)
            if group is None:
                raise NotFound("serving target")
            tasks = await task_rows.of_group(self.store, target_id, include_deleted=False)
            return group.spec.template.idle_timeout_minutes, serving_replicas(tasks)
        task = await self.store.get_task(target_id)
        return task.spec.idle_timeout_minutes, [task]

    async def _running_s(self, running: Sequence[Task]) -> float:
        """Seconds since the newest of `running` became running (its last status change)."""
        now = self.clock()
        starts = []
        for m in running:
            last = await self.store.last_of_type(m.id, TaskStatusChanged.type)
            starts.append(last.occurred_at if last is not None else m.updated_at)
        return max(0.0, (now - max(starts)).total_seconds())
