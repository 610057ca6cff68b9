"""Why a task pends, where it stands in its queue, and when it should start (docs/scheduling.md,
"Plan and ETA").

The binding constraint is the scheduler's own last reason for the task (its stage by
`dryrun.stage_of`). The reason names a resource (waits.py: capacity on the nodes that can
take it, the tenant's quota or the queue's); a retry backoff is its end, any other reason
has no estimate.

Each holder ends at its `timeout` or after the typical runtime of its tenant's finished tasks
of the same image (`Runtime`, at least `MIN_SAMPLES` of them). The wait is replayed forward:
at each end the resource frees, the work ahead that fits starts in the planner's order (greedy:
a task that does not fit does not block those behind it) and holds its share until its own
bound, and the estimate is when the task fits; the range is the same replay with every end at
its low and its high. Nothing bounds it (a holder or a task ahead that must end first has
neither bound, or no node can take the task) → no estimate: `eta` is None, shown "unknown".
"""

from __future__ import annotations

import heapq
import itertools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from .dryrun import stage_of, variant_opens
from .ledger import LEAVING, Ledger
from .model import ClusterSnapshot, PendingTask
from .planner import Evaluation, _order_key
from .queues import with_queues
from .reasons import Reason
from .stages import check_static
from .variants import as_variant
from .waits import Need, capacity, queue, tenant

MIN_SAMPLES = 3


@dataclass(frozen=True, slots=True)
class Runtime:
    """A tenant's typical runtime of one image, in seconds: median, p10 and p90."""

    median_s: float
    low_s: float
    high_s: float
    samples: int


def runtime_of(durations: Sequence[float]) -> Runtime | None:
    if len(durations) < MIN_SAMPLES:
        return None
    ordered = sorted(durations)
    q = statistics.quantiles(ordered, n=10, method="inclusive")
    return Runtime(statistics.median(ordered), q[0], q[-1], len(ordered))


@dataclass(frozen=True, slots=True)
class Holding:
    """A placed task as the estimate sees it."""

    started_at: datetime | None  # None: placed, not started (counted from now)
    timeout_s: int = 0
    runtime: Runtime | None = None


@dataclass(frozen=True, slots=True)
class Eta:
    at: datetime
    low: datetime
    high: datetime
    how: str = ""  # what bounds it: "timeout", "runtime", "both", "leaving", "backoff", "now"


def end_of(h: Holding, now: datetime) -> Eta | None:
    """When a holder should end (None: nothing bounds it)."""
    start = h.started_at or now
    deadline = start + timedelta(seconds=h.timeout_s) if h.timeout_s else None
    if h.runtime is None:
        if deadline is None:
            return None
        return Eta(max(now, deadline), now, max(now, deadline), "timeout")

    def at(s: float) -> datetime:
        t = max(now, start + timedelta(seconds=s))
        return min(t, deadline) if deadline else t

    r = h.runtime
    return Eta(at(r.median_s), at(r.low_s), at(r.high_s), "both" if deadline else "runtime")


@dataclass(frozen=True, slots=True)
class PendingInfo:
    """The "why pending" answer of one task."""

    stage: str
    reason: Reason | None
    detail: str
    queue: str
    position: int  # 1 = next in its queue
    eta: Eta | None
    method: str


def estimate(
    snapshot: ClusterSnapshot,
    task: PendingTask,
    pending: Sequence[PendingTask],
    holding: Mapping[str, Holding],
    *,
    reason: Reason | None,
    detail: str = "",
) -> PendingInfo:
    """`task`'s answer; `pending` is every pending task (itself included), `holding` the
    placed tasks by id and, for the pending ones, their timeout and typical runtime (their
    `started_at` is ignored: each is counted from when it would start)."""
    queued = with_queues(pending, snapshot.queues)
    me = next((t for t in queued if t.task_id == task.task_id), with_queues([task], {})[0])
    order = sorted(queued, key=_order_key)
    ahead = order[: order.index(me)] if me in order else order
    position = 1 + sum(1 for t in ahead if t.queue == me.queue)
    ahead = [_preferred(t) for t in ahead]
    if me.variants:
        eta, method = _eta_of_variants(snapshot, me, ahead, holding, reason)
    else:
        eta, method = _eta(snapshot, me, ahead, holding, reason)
    return PendingInfo(stage_of(reason), reason, detail, me.queue, position, eta, method)


def _preferred(task: PendingTask) -> PendingTask:
    """A task of the work ahead as its first variant (what it is placed as while it can be)."""
    return as_variant(task, task.variants[0]) if task.variants else task


def _eta_of_variants(
    snapshot: ClusterSnapshot,
    task: PendingTask,
    ahead: Sequence[PendingTask],
    holding: Mapping[str, Holding],
    reason: Reason | None,
) -> tuple[Eta | None, str]:
    """The earliest start over its variants, each not before it is considered. The recorded
    reason is the first variant's; the others are estimated as for capacity."""
    best: tuple[Eta, str] | None = None
    for pos, var in enumerate(task.variants):
        eta, method = _eta(
            snapshot, as_variant(task, var), ahead, holding, reason if pos == 0 else None
        )
        if eta is None:
            continue
        opens = variant_opens(task, pos)
        eta = Eta(max(eta.at, opens), max(eta.low, opens), max(eta.high, opens), eta.how)
        if best is None or eta.at < best[0].at:
            best = (eta, f"variants[{var.index}] (considered from {opens.isoformat()}): {method}")
    if best is None:
        return None, "no variant's start is bounded: " + _eta(
            snapshot, as_variant(task, task.variants[0]), ahead, holding, reason
        )[1]
    return best


def needs_line(snapshot: ClusterSnapshot, task: PendingTask, reason: Reason | None) -> bool:
    """Whether the work ahead can matter to `task`'s estimate: a capacity or quota reason,
    with some node that can take it. Otherwise the answer needs no queue (it is a backoff's
    end, or unknown)."""
    if task.variants:
        return any(
            needs_line(snapshot, as_variant(task, v), reason if i == 0 else None)
            for i, v in enumerate(task.variants)
        )
    if reason in _CAPACITY or reason is None:
        queued = with_queues([task], snapshot.queues)[0]
        return any(check_static(queued, n).ok for n in snapshot.nodes)
    return reason in (Reason.TENANT_QUOTA_EXCEEDED, Reason.QUEUE_QUOTA_EXCEEDED)


def queues_before(snapshot: ClusterSnapshot, queue: str) -> tuple[tuple[str, ...], bool]:
    """(queues whose tasks all come before `queue`'s, whether `queue` is fifo): the
    planner's order across queues ("" is no queue, priority 0)."""
    limits = snapshot.queues.get(queue) if queue else None
    mine = limits.priority if limits else 0
    first = tuple(sorted(n for n, q in snapshot.queues.items() if q.priority > mine))
    return (*first, *([""] if mine < 0 else [])), bool(limits and limits.fifo)


_CAPACITY = {
    Reason.INSUFFICIENT_GPUS,
    Reason.FRACTION_UNAVAILABLE,
    Reason.POOL_CAPACITY,
    Reason.INSUFFICIENT_MEMORY,
    Reason.INSUFFICIENT_CPU,
}


def _eta(
    snapshot: ClusterSnapshot,
    task: PendingTask,
    ahead: Sequence[PendingTask],
    holding: Mapping[str, Holding],
    reason: Reason | None,
) -> tuple[Eta | None, str]:
    now = snapshot.now
    if reason is Reason.BACKOFF and task.not_before is not None:
        return Eta(task.not_before, task.not_before, task.not_before, "backoff"), "retry backoff"
    ev = Evaluation.of(snapshot, None)
    ledger = Ledger(ev.index, snapshot.allocations, ev.gpus)
    if reason is None or reason in _CAPACITY:
        needs: list[Need | None] = [capacity(ev, ledger, task, ahead, reason)]
    elif reason is Reason.TENANT_QUOTA_EXCEEDED:
        needs = [tenant(ev, ledger, task, ahead)]
    elif reason is Reason.QUEUE_QUOTA_EXCEEDED:
        needs = list(queue(ev, ledger, task, ahead))
    else:
        return None, f"nothing that ends frees it: it waits for a change ({reason.value})"
    worst: tuple[Eta, str] | None = None
    for need in needs:
        if need is None:  # only _capacity answers None
            return None, "no node that can take it: it waits for a node to come"
        found = _when(need, holding, now)
        if found[0] is None:
            return found
        if worst is None or found[0].at > worst[0].at:
            worst = (found[0], found[1])
    if worst is None:
        return Eta(now, now, now, "now"), "fits: placed at the next evaluation"
    return worst


def _when(need: Need, holding: Mapping[str, Holding], now: datetime) -> tuple[Eta | None, str]:
    """Replay the resource forward: at each end of a holder, the tasks ahead that fit start
    in order (each then holds its share until its own bounded end), until this one fits."""
    ends: list[tuple[Eta, float]] = []
    unbounded = 0
    for a in need.holders:
        w = need.weight(a)
        if w <= 0:
            continue
        if a.status in LEAVING:
            ends.append((Eta(now, now, now, "leaving"), w))
            continue
        h = holding.get(a.task_id)
        end = end_of(h, now) if h is not None else None
        if end is None:
            unbounded += 1
        else:
            ends.append((end, w))
    found = [_replay(need, ends, holding, now, key) for key in ("at", "low", "high")]
    at, low, high = found
    if at is None or low is None or high is None:
        return None, (
            f"{need.what}; {unbounded} placed task(s) holding it, or work ahead of it, have no "
            "timeout and no typical runtime of their image: nothing bounds when enough is freed"
        )
    hows = sorted({e.how for e, _ in ends}) or ["free now"]
    method = f"{need.what}; freed as placed tasks end (by {', '.join(hows)})"
    if need.own <= need.free + 1e-9 and not need.ahead:
        method = f"{need.what}: placed at the next evaluation"
    return Eta(at, min(low, at), max(high, at), "+".join(hows)), method


def _replay(
    need: Need,
    ends: Sequence[tuple[Eta, float]],
    holding: Mapping[str, Holding],
    now: datetime,
    key: str,
) -> datetime | None:
    heap: list[tuple[datetime, int, float]] = [
        (getattr(e, key), i, w) for i, (e, w) in enumerate(ends)
    ]
    heapq.heapify(heap)
    tick = itertools.count(len(heap))
    waiting: list[tuple[str, float]] = [*need.ahead, ("", need.own)]
    free, t = need.free, now
    while True:
        still: list[tuple[str, float]] = []
        for tid, demand in waiting:
            if demand > free + 1e-9:
                still.append((tid, demand))
                continue
            if not tid:
                return t
            free -= demand
            h = holding.get(tid)
            end = end_of(replace(h, started_at=t), t) if h is not None else None
            if end is not None:
                heapq.heappush(heap, (getattr(end, key), next(tick), demand))
        waiting = still
        if not heap:
            return None
        at, _, w = heapq.heappop(heap)
        t, free = max(t, at), free + w
