"""What really happened: the event log read into the inputs of a replay and its recorded trace.

Every event is folded with the live evolve functions (libs/store/projections.AGGREGATES), and
the transitions of each task are read off its folds: it waits from its submission (or its
return to `pending`) until a placement (a move into GPU_HOLDING), holds what the placement
gave it until it leaves GPU_HOLDING, and may be preempted (`preempting`) or withdrawn by its
tenant or an operator (a stop, a cancel, a delete). The nodes, tenant quotas, queues, pools
and static-world groups become timed configuration changes; the scheduler's own writes (its
placements and "why pending" updates) give the times its rounds ran.

Work placed before the window (`since`) and still holding then replays as it happened: it
occupies its node and is left out of the figures.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from libs.domain.catalog import PAYLOAD_TYPES
from libs.domain.group.model import Group
from libs.domain.node.model import Node as NodeDoc
from libs.domain.pool.model import NodeSelector, Pool, Queue
from libs.domain.task.events import TaskDeleted, TaskPendingReason, TaskStatusChanged
from libs.domain.task.model import Task
from libs.domain.task.states import GPU_HOLDING, Actor, TaskStatus
from libs.domain.tenant.events import TenantCreated, TenantUpdated
from libs.store.projections import AGGREGATES, GROUPS, NODES, POOLS, QUEUES, TASKS

from ..placement.feasibility import allocation_cost
from ..placement.model import Allocation, Gpu, QueueLimits
from ..view import Gang, limits_of, to_node
from .autoscale import AutoscaleLog

S = TaskStatus
WITHDRAWN_BY = frozenset({Actor.TENANT.value, Actor.OPERATOR.value})
WITHDRAW_TO = frozenset({S.STOPPING, S.CANCELLED, S.STOPPED})


@dataclass(frozen=True, slots=True)
class Change:
    """A configuration change at `at`: `kind` node | quota | queue | pool | gang, `key` its
    name, `value` the new state (None: gone)."""

    at: datetime
    kind: str
    key: str
    value: Any


@dataclass(slots=True)
class Attempt:
    """One placement of a task, as recorded."""

    pending_since: datetime
    placed_at: datetime
    allocation: Allocation
    cards: float
    released_at: datetime | None = None  # None: still holding at the end of the log
    preempted: bool = False
    withdrawn: bool = False  # ended by its tenant's or an operator's stop
    requeued_at: datetime | None = None  # back in `pending` after it (a retry)


@dataclass(slots=True)
class TaskRecord:
    task: Task  # as it waited (its last pending state): what placement is given
    pending_since: datetime
    attempts: list[Attempt] = field(default_factory=list)
    withdrawn_at: datetime | None = None
    status: TaskStatus = S.PENDING

    @property
    def id(self) -> str:
        return self.task.id

    @property
    def queue(self) -> str:
        return self.task.spec.queue

    @property
    def image_key(self) -> tuple[str, str]:
        return (self.task.tenant_id, self.task.spec.image)


@dataclass(frozen=True, slots=True)
class Work:
    """One attempt's worth of work: how long it held (None: until withdrawn or the end) and
    how long after it the task was back in `pending` (None: it was not)."""

    hold_s: float | None
    requeue_after_s: float | None


@dataclass
class Recording:
    """The replay's inputs over [since, until]."""

    since: datetime
    until: datetime
    events: int
    changes: list[Change]
    rounds: list[datetime]  # when the scheduler wrote (placements, "why pending"), in order
    tasks: list[TaskRecord]  # submitted in the window, or pending when it opened
    background: list[TaskRecord]  # holding when it opened: replayed as they happened
    tenants: frozenset[str] = frozenset()
    queue_names: frozenset[str] = frozenset()
    autoscale: AutoscaleLog = field(default_factory=AutoscaleLog)  # the groups' samples

    def work_of(self, rec: TaskRecord) -> list[Work]:
        """The task's attempts that were not preempted (a preempted one is redone)."""
        out: list[Work] = []
        for a in rec.attempts:
            if a.preempted or a.placed_at < self.since:
                continue
            hold = None
            if a.released_at is not None and not a.withdrawn:
                hold = (a.released_at - a.placed_at).total_seconds()
            requeue = None
            if a.requeued_at is not None and a.released_at is not None:
                requeue = (a.requeued_at - a.released_at).total_seconds()
            out.append(Work(hold, requeue))
        return out


class _Folder:
    def __init__(self, since: datetime) -> None:
        self.since = since
        self.states: dict[str, dict[str, Any]] = {t: {} for t in AGGREGATES}
        self.records: dict[str, TaskRecord] = {}
        self.changes: list[Change] = []
        self.rounds: list[datetime] = []
        self.gpus: dict[str, Gpu] = {}
        self.tenants: set[str] = set()
        self.queues: set[str] = set()
        self.autoscale = AutoscaleLog()

    def apply(
        self, stream_type: str, stream_id: str, version: int, kind: str, text: str, at: datetime
    ) -> None:
        payload = PAYLOAD_TYPES[kind].model_validate_json(text)
        if isinstance(payload, TenantCreated | TenantUpdated):
            self.tenants.add(payload.tenant_id)
            if payload.gpu_quota is not None:
                self.changes.append(
                    Change(at, "quota", payload.tenant_id, float(payload.gpu_quota))
                )
            return
        agg = AGGREGATES.get(stream_type)
        if agg is None:
            return
        states = self.states[stream_type]
        before = states.get(stream_id)
        after = agg.evolve(before, payload, at, version)
        states[stream_id] = after
        if stream_type == TASKS.stream_type:
            self._task(before, after, payload, at)
        elif stream_type == NODES.stream_type:
            self._node(after, at)
        elif stream_type == QUEUES.stream_type:
            self._queue(after, at)
        elif stream_type == POOLS.stream_type:
            self._pool(after, at)
        elif stream_type == GROUPS.stream_type:
            self._group(after, at)
            self.autoscale.add(payload, at.timestamp(), after.spec.template.name)

    def _node(self, doc: NodeDoc, at: datetime) -> None:
        for g in to_node(doc).gpus:
            self.gpus[g.id] = g
        self.changes.append(Change(at, "node", doc.id, doc))

    def _queue(self, q: Queue, at: datetime) -> None:
        self.queues.add(q.spec.name)
        value: QueueLimits | None = None if q.deleted_at else limits_of(q)
        self.changes.append(Change(at, "queue", q.spec.name, value))

    def _pool(self, p: Pool, at: datetime) -> None:
        value: NodeSelector | None = None if p.deleted_at else p.spec.node_selector
        self.changes.append(Change(at, "pool", p.spec.name, value))

    def _group(self, g: Group, at: datetime) -> None:
        gang = Gang(g.spec.shape.task_count, g.spec.shape.master_port)
        value = gang if g.spec.static_world and not g.deleted_at else None
        self.changes.append(Change(at, "gang", g.id, value))

    def _task(self, before: Task | None, after: Task, payload: Any, at: datetime) -> None:
        self.tenants.add(after.tenant_id)
        rec = self.records.get(after.id)
        if rec is None:
            rec = self.records[after.id] = TaskRecord(after, at)
        rec.status = after.status
        if isinstance(payload, TaskPendingReason):
            self.rounds.append(at)
        if after.status is S.PENDING:
            rec.task = after
        if isinstance(payload, TaskDeleted) and rec.withdrawn_at is None:
            rec.withdrawn_at = at
        if not isinstance(payload, TaskStatusChanged) or before is None:
            return
        if payload.actor == Actor.SCHEDULER.value:
            self.rounds.append(at)
        was, now = before.status in GPU_HOLDING, after.status in GPU_HOLDING
        last = rec.attempts[-1] if rec.attempts else None
        if not was and now:
            alloc = Allocation.from_task(after, self.gpus)
            cost = allocation_cost(alloc, self.gpus)
            rec.attempts.append(Attempt(rec.pending_since, at, alloc, cost))
        elif was and not now and last is not None:
            last.released_at = at
        if payload.to_status is S.PREEMPTING and last is not None:
            last.preempted = True
        if payload.actor in WITHDRAWN_BY and payload.to_status in WITHDRAW_TO:
            if rec.withdrawn_at is None:
                rec.withdrawn_at = at
            if last is not None and last.released_at is None:
                last.withdrawn = True
        if after.status is S.PENDING and before.status is not S.PENDING:
            rec.pending_since = at
            if last is not None:
                last.requeued_at = at


def record(
    events: Iterable[tuple[str, str, int, str, str, datetime]],
    since: datetime | None = None,
) -> Recording:
    """The recording of `events` ((stream_type, stream_id, version, type, payload JSON text,
    occurred_at), in log order) over [since, the last event]; no `since`: all of it."""
    folder: _Folder | None = None
    count = 0
    first: datetime | None = None
    last: datetime | None = None
    pending: list[tuple[str, str, int, str, str, datetime]] = []
    for ev in events:
        pending.append(ev)
        count += 1
        first = ev[5] if first is None else min(first, ev[5])
        last = ev[5] if last is None else max(last, ev[5])
    if first is None or last is None:
        raise ValueError("the event log is empty")
    start = since if since is not None else first
    folder = _Folder(start)
    for ev in pending:
        folder.apply(*ev)
    tasks: list[TaskRecord] = []
    background: list[TaskRecord] = []
    for rec in folder.records.values():
        kind = _in_window(rec, start)
        if kind == "task":
            tasks.append(rec)
        elif kind == "background":
            background.append(rec)
    return Recording(
        since=start,
        until=last,
        events=count,
        changes=folder.changes,
        rounds=sorted({t for t in folder.rounds if t >= start}),
        tasks=sorted(tasks, key=lambda r: r.id),
        background=sorted(background, key=lambda r: r.id),
        tenants=frozenset(folder.tenants),
        queue_names=frozenset(folder.queues),
        autoscale=folder.autoscale,
    )


def _in_window(rec: TaskRecord, since: datetime) -> str:
    """ "task" (replayed), "background" (holding when the window opened) or "" (neither)."""
    created = rec.task.created_at
    if created >= since:
        return "task"
    if rec.withdrawn_at is not None and rec.withdrawn_at <= since:
        return ""
    for a in rec.attempts:
        if a.placed_at < since and (a.released_at is None or a.released_at > since):
            return "background"
    # Not holding then: waiting, if it was placed afterwards or waits still.
    placed_later = any(a.placed_at >= since for a in rec.attempts)
    return "task" if placed_later or rec.status is S.PENDING else ""


def entered(rec: TaskRecord, since: datetime) -> datetime:
    """When the task began the wait the window opens on (its submission, or the time it was
    last put back in `pending` before the window)."""
    later = [a for a in rec.attempts if a.placed_at >= since]
    return later[0].pending_since if later else rec.pending_since
