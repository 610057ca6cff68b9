"""The replay itself: the recorded submissions and node events through the real planner, on a
simulated clock, under a policy.

Time moves from event to event (a heap ordered by time, then kind, then sequence): at one
instant configuration changes come first, then work ending, then withdrawals, then work
arriving, then a scheduling round. Rounds run when the recorded scheduler wrote (its rounds),
and whenever the simulation frees capacity or changes the cluster; like the placement
controller, a round that placed or preempted something is followed at once by another.

Each round builds a `ClusterSnapshot` and `PendingTask`s the way the scheduler's view does
(services/scheduler/view.py) and calls `Planner.plan` (services/scheduler/placement/): the
same stages, rankers, quotas, queues and preemption. A placed task holds its grant for as
long as that attempt held in the log, then either ends or, if the log retried it, is back in
`pending` as long after as it was then. A preempted task loses what it ran and redoes the
attempt. Work the log never placed holds for the median hold of its tenant's tasks of the
same image (or to the end of the window if there is none). An attempt lasts as it did
whatever node it lands on (a node lost under it in the log is not replayed onto another).
"""

from __future__ import annotations

import heapq
import statistics
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from libs.domain.node.model import Node as NodeDoc
from libs.domain.pool.model import NodeSelector
from libs.domain.task.model import Task
from libs.domain.task.states import TaskStatus

from ..placement.feasibility import allocation_cost
from ..placement.model import Allocation, ClusterSnapshot, Gpu, Node, PendingTask, QueueLimits
from ..placement.planner import DEFAULT_MAX_CANDIDATES, Planner
from ..view import Gang, pending_of, tag_pools, to_node
from .policy import Policy
from .record import Attempt, Recording, TaskRecord, Work, entered

BATCH = 512  # the scheduler's schedule_batch default
ROUNDS_AT_ONCE = 64  # back-to-back rounds at one instant, at most

# Kinds, in their order at one instant.
CHANGE, FIXED_END, END, WITHDRAW, FIXED_START, ARRIVE, ROUND = range(7)


@dataclass(frozen=True, slots=True)
class Run:
    """One placement in a trace (recorded or replayed)."""

    task_id: str
    tenant: str
    queue: str
    pending_since: datetime
    placed_at: datetime
    released_at: datetime | None  # None: still holding at the end
    cards: float
    node_id: str
    gpu_ids: tuple[str, ...]
    preempted: bool = False


@dataclass
class Trace:
    """What a run of the window did: its placements, and the work it never placed."""

    until: datetime
    runs: list[Run] = field(default_factory=list)
    never_placed: list[tuple[str, str, str]] = field(default_factory=list)  # task, tenant, queue
    withdrawn_waiting: int = 0


@dataclass(slots=True)
class _Held:
    rec: TaskRecord
    alloc: Allocation
    pending_since: datetime
    placed_at: datetime
    step: int
    token: int


def recorded_trace(rec: Recording) -> Trace:
    """The trace of what really happened to the window's tasks."""
    trace = Trace(rec.until)
    for t in rec.tasks:
        runs = [a for a in t.attempts if a.placed_at >= rec.since]
        trace.runs.extend(_run(t, a) for a in runs)
        if t.status is TaskStatus.PENDING and t.withdrawn_at is None:
            trace.never_placed.append((t.id, t.task.tenant_id, t.queue))
    trace.runs.sort(key=_run_key)
    trace.never_placed.sort()
    return trace


def _run(t: TaskRecord, a: Attempt) -> Run:
    return Run(
        t.id,
        t.task.tenant_id,
        t.queue,
        a.pending_since,
        a.placed_at,
        a.released_at,
        a.cards,
        a.allocation.node_id,
        a.allocation.gpu_ids,
        a.preempted,
    )


def _run_key(r: Run) -> tuple[datetime, str]:
    return (r.placed_at, r.task_id)


class Replay:
    """One replay of a recording under a policy (`run` once)."""

    def __init__(self, rec: Recording, policy: Policy) -> None:
        self.rec, self.policy = rec, policy
        self.planner = Planner()
        self.heap: list[tuple[datetime, int, int, Any]] = []
        self.seq = 0
        self.docs: dict[str, NodeDoc] = {}
        self.quotas: dict[str, float] = {}
        self.queues: dict[str, QueueLimits] = {}
        self.pools: dict[str, NodeSelector] = {}
        self.gangs: dict[str, Gang] = {}
        self.nodes: tuple[Node, ...] | None = None  # rebuilt only when a node or pool moved
        self.gpus: dict[str, Gpu] = {}
        self.pending: dict[str, tuple[TaskRecord, datetime, int]] = {}
        self.held: dict[str, _Held] = {}
        self.fixed: dict[tuple[str, int], Allocation] = {}
        self.work: dict[str, list[Work]] = {t.id: rec.work_of(t) for t in rec.tasks}
        self.typical = _typical_holds(rec, self.work)
        self.tokens = 0
        self.trace = Trace(rec.until)
        self.round_due: datetime | None = None
        # A task's PendingTask depends on it and the gangs alone: built once per gang change.
        self.asks: dict[str, PendingTask] = {}
        self.clean: dict[str, Task] = {}
        self.withdrawn: set[str] = set()

    def push(self, at: datetime, kind: int, item: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, kind, self.seq, item))

    def run(self) -> Trace:
        rec = self.rec
        for ch in rec.changes:
            self.push(max(ch.at, rec.since), CHANGE, ch)
        for t in rec.background:
            for i, a in enumerate(t.attempts):
                if a.released_at is not None and a.released_at <= rec.since:
                    continue
                self.push(max(a.placed_at, rec.since), FIXED_START, (t.id, i, a))
                if a.released_at is not None:
                    self.push(a.released_at, FIXED_END, (t.id, i))
        for t in rec.tasks:
            since = entered(t, rec.since)
            self.push(max(t.task.created_at, rec.since), ARRIVE, (t, since, 0))
            if t.withdrawn_at is not None:
                self.push(t.withdrawn_at, WITHDRAW, t.id)
        for at in rec.rounds:
            self.push(at, ROUND, None)
        self.push(rec.since, ROUND, None)
        while self.heap:
            at, kind, _, item = heapq.heappop(self.heap)
            if at > rec.until:
                break
            self._step(at, kind, item)
        self._close()
        return self.trace

    def _step(self, at: datetime, kind: int, item: Any) -> None:
        if kind == CHANGE:
            self._change(item)
            self._round_soon(at)
        elif kind == FIXED_START:
            task_id, i, a = item
            self.fixed[(task_id, i)] = replace(a.allocation, preemptible=False)
        elif kind == FIXED_END:
            self.fixed.pop(item, None)
            self._round_soon(at)
        elif kind == END:
            self._end(at, *item)
        elif kind == WITHDRAW:
            self._withdraw(at, item)
        elif kind == ARRIVE:
            t, since, step = item
            if t.id in self.withdrawn:
                return  # a retry due after its tenant withdrew it
            self.pending[t.id] = (t, since, step)
            if step:  # back after a retry: the scheduler is woken by the requeue
                self._round_soon(at)
        elif kind == ROUND and self.round_due != at:
            self.round_due = at
            self._rounds(at)

    def _round_soon(self, at: datetime) -> None:
        self.push(at, ROUND, None)
        self.round_due = None

    def _change(self, ch: Any) -> None:
        if ch.kind == "node":
            self.docs[ch.key] = ch.value
            self.nodes = None
        elif ch.kind == "pool":
            if ch.value is None:
                self.pools.pop(ch.key, None)
            else:
                self.pools[ch.key] = ch.value
            self.nodes = None
        elif ch.kind == "quota":
            self.quotas[ch.key] = ch.value
        elif ch.kind == "queue":
            if ch.value is None:
                self.queues.pop(ch.key, None)
            else:
                self.queues[ch.key] = self.policy.queue_over(ch.value)
        elif ch.kind == "gang":
            self.asks.clear()
            if ch.value is None:
                self.gangs.pop(ch.key, None)
            else:
                self.gangs[ch.key] = ch.value

    # --- rounds ----------------------------------------------------------------------

    def _snapshot(self, at: datetime) -> ClusterSnapshot:
        if self.nodes is None:
            self.nodes = tag_pools(
                tuple(to_node(d) for _, d in sorted(self.docs.items())), self.pools
            )
            self.gpus = {g.id: g for n in self.nodes for g in n.gpus}
        allocations = [self.fixed[k] for k in sorted(self.fixed)]
        allocations += [self.held[k].alloc for k in sorted(self.held)]
        return ClusterSnapshot(
            now=at,
            nodes=self.nodes,
            allocations=tuple(allocations),
            tenant_quotas=self.policy.quotas_over(self.quotas),
            queues=self.queues,
        )

    def _batch(self) -> list[PendingTask]:
        """What the scheduler loads: the `BATCH` highest priority, oldest first."""
        waiting = sorted(
            self.pending.values(),
            key=lambda p: (-p[0].task.spec.priority, p[0].task.created_at, p[0].id),
        )[:BATCH]
        out = []
        for t, _, _ in waiting:
            ask = self.asks.get(t.id)
            if ask is None:
                ask = self.asks[t.id] = pending_of(self._clean(t), self.gangs)
            out.append(ask)
        return out

    def _clean(self, t: TaskRecord) -> Task:
        task = self.clean.get(t.id)
        if task is None:
            task = self.clean[t.id] = _clean(t.task)
        return task

    def _rounds(self, at: datetime) -> None:
        for _ in range(ROUNDS_AT_ONCE):
            if not self.pending:
                return
            snap = self._snapshot(at)
            plan = self.planner.plan(
                snap, self._batch(), max_batch=BATCH, max_candidates=DEFAULT_MAX_CANDIDATES
            )
            for pl in plan.placements:
                self._place(at, pl.task_id, pl.node_id, pl.gpu_ids, pl.variant)
            victims = sorted({v for pre in plan.preemptions for v in pre.victims})
            for v in victims:
                self._preempted(at, v)
            if not plan.placements and not victims:
                return

    def _place(
        self,
        at: datetime,
        task_id: str,
        node_id: str,
        gpu_ids: tuple[str, ...],
        variant: int | None,
    ) -> None:
        t, since, step = self.pending.pop(task_id)
        placed = self._clean(t).model_copy(
            update={
                "status": TaskStatus.RUNNING,
                "node_id": node_id,
                "gpu_ids": gpu_ids,
                "variant": variant,
            }
        )
        alloc = self.policy.allocation(Allocation.from_task(placed, self.gpus))
        self.tokens += 1
        self.held[task_id] = _Held(t, alloc, since, at, step, self.tokens)
        hold = self._hold_s(t, step)
        if hold is not None:
            self.push(at + timedelta(seconds=hold), END, (task_id, self.tokens))

    def _hold_s(self, t: TaskRecord, step: int) -> float | None:
        work = self.work[t.id]
        if step < len(work):
            return work[step].hold_s
        return self.typical.get(t.image_key)

    def _release(self, at: datetime, task_id: str, preempted: bool) -> _Held:
        h = self.held.pop(task_id)
        cost = allocation_cost(h.alloc, self.gpus)
        self.trace.runs.append(
            Run(
                task_id,
                h.rec.task.tenant_id,
                h.rec.queue,
                h.pending_since,
                h.placed_at,
                at,
                cost,
                h.alloc.node_id,
                h.alloc.gpu_ids,
                preempted,
            )
        )
        self._round_soon(at)
        return h

    def _end(self, at: datetime, task_id: str, token: int) -> None:
        h = self.held.get(task_id)
        if h is None or h.token != token:
            return  # preempted or withdrawn since
        self._release(at, task_id, preempted=False)
        work = self.work[task_id]
        if h.step < len(work) and work[h.step].requeue_after_s is not None:
            back = at + timedelta(seconds=work[h.step].requeue_after_s or 0.0)
            self.push(back, ARRIVE, (h.rec, back, h.step + 1))

    def _preempted(self, at: datetime, task_id: str) -> None:
        if task_id not in self.held:
            return
        h = self._release(at, task_id, preempted=True)
        self.pending[task_id] = (h.rec, at, h.step)  # the attempt is redone

    def _withdraw(self, at: datetime, task_id: str) -> None:
        if task_id in self.pending:
            del self.pending[task_id]
            self.trace.withdrawn_waiting += 1
        elif task_id in self.held:
            self._release(at, task_id, preempted=False)
        self.withdrawn.add(task_id)  # nothing comes back after a withdrawal

    def _close(self) -> None:
        for task_id in sorted(self.held):
            h = self.held[task_id]
            self.trace.runs.append(
                Run(
                    task_id,
                    h.rec.task.tenant_id,
                    h.rec.queue,
                    h.pending_since,
                    h.placed_at,
                    None,
                    allocation_cost(h.alloc, self.gpus),
                    h.alloc.node_id,
                    h.alloc.gpu_ids,
                )
            )
        self.trace.never_placed = sorted(
            (t.id, t.task.tenant_id, t.queue) for t, _, _ in self.pending.values()
        )
        self.trace.runs.sort(key=_run_key)


def _clean(task: Task) -> Task:
    """The task as placement first sees it: without the constraints a requeue added."""
    return task.model_copy(
        update={
            "status": TaskStatus.PENDING,
            "node_id": None,
            "gpu_ids": (),
            "avoid_node_ids": [],
            "not_before": None,
            "same_node_id": "",
            "min_vram_mb": 0,
        }
    )


def _typical_holds(rec: Recording, work: dict[str, list[Work]]) -> dict[tuple[str, str], float]:
    """The median hold of each (tenant, image) over the attempts that ended by themselves."""
    holds: dict[tuple[str, str], list[float]] = {}
    for t in rec.tasks:
        for w in work[t.id]:
            if w.hold_s is not None:
                holds.setdefault(t.image_key, []).append(w.hold_s)
    return {k: statistics.median(v) for k, v in holds.items()}


def replay(rec: Recording, policy: Policy) -> Trace:
    return Replay(rec, policy).run()
