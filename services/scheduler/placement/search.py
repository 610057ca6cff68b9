"""Finding the nodes that fit one task, and knowing every other node's reason without
checking it.

Only nodes that can hold the request are checked in detail: the online classes whose static
stages pass (index.py), from the ledger bucket of the fewest free whole cards that can hold
the request upwards, best-packed first. Within a bucket the walk starts at an offset drawn
from `random.Random(task_id)`, so equal nodes share the load and a decision replays. The walk
stops after `limit` fits (None: no limit): the bin-pack's first key (free whole cards left)
is still the best the cluster offers, the later keys are the best among the fits seen.

When nothing fits, the walk has checked every node the index could not rule out, and the
index knows exactly why it ruled out the rest (a whole class offline, of the wrong type or
too small; too few free whole cards), so the reasons and counts of the "why pending" answer
are exact for every node, not sampled.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from .feasibility import EPS, Fit, Quota
from .index import ClusterIndex, NodeClass
from .ledger import FULL, Ledger
from .model import PendingTask
from .reasons import Reason, Verdict, reject
from .stages import check_capacity, check_node


def start_key(task: PendingTask) -> int:
    """The lowest ledger bucket where `task` may fit: whole cards need that many free; a
    fraction needs a free or a shared card; work without GPUs fits anywhere."""
    req = task.requirement
    if req.gpu_count:
        return req.gpu_count
    return 0 if req.is_fractional else FULL


def below_start_reason(task: PendingTask) -> Reason:
    return Reason.INSUFFICIENT_GPUS if task.requirement.gpu_count else Reason.FRACTION_UNAVAILABLE


@dataclass
class Search:
    """What one walk found: the fits, and the verdict of every node that failed a check.
    When `fits` is empty, every node the index did not rule out is in `failed`. A verdict
    here is exact in its reason; its message may be empty (explain() checks the one node it
    reports again)."""

    task: PendingTask
    fits: list[Fit] = field(default_factory=list)
    failed: dict[int, Verdict] = field(default_factory=dict)  # node position -> verdict
    pinned: int | None = None  # position of the one node a pinned task may use
    excluded: frozenset[int] = frozenset()  # positions of online excluded nodes


def search(
    index: ClusterIndex, ledger: Ledger, task: PendingTask, quota: Quota | None, limit: int | None
) -> Search:
    """Walk the nodes that may fit `task`, fewest free whole cards first, until `limit` fit."""
    if task.pins:
        return _search_pinned(index, ledger, task, quota)
    excluded = frozenset(
        pos
        for node_id in task.excluded_node_ids
        if (pos := index.position.get(node_id)) is not None and index.nodes[pos].online
    )
    found = Search(task, excluded=excluded)
    passing = index.passing(task)
    if not passing:
        return found
    rng = random.Random(task.task_id)
    req = task.requirement
    for key in range(start_key(task), index.max_cards + 1):
        lists = [b for cls in passing if (b := ledger.buckets[cls.id].get(key))]
        for pos in seeded_walk(lists, rng):
            if pos in excluded:
                continue
            node = index.nodes[pos]
            usage = ledger.usage_on(node.id)
            if not req.needs_gpu:
                # No card stage: memory then CPU come first, and comparing two numbers is
                # all either takes (the message is rebuilt in full for the node reported).
                if req.memory_mb > node.memory_mb - usage.memory_mb:
                    found.failed[pos] = _NO_MEMORY
                    continue
                if req.cpu_cores > node.cpu_cores - usage.cpu_cores + EPS:
                    found.failed[pos] = _NO_CPU
                    continue
            verdict, fit = check_capacity(task, node, usage, quota=quota)
            if fit is None:
                found.failed[pos] = verdict
                continue
            found.fits.append(fit)
            # A fit from a later bucket would leave at least as many free whole cards as
            # every fit of this one (see start_key): stopping loses nothing on that key.
            if limit is not None and len(found.fits) >= limit:
                return found
    return found


_NO_MEMORY = reject(Reason.INSUFFICIENT_MEMORY, "")
_NO_CPU = reject(Reason.INSUFFICIENT_CPU, "")


def _search_pinned(
    index: ClusterIndex, ledger: Ledger, task: PendingTask, quota: Quota | None
) -> Search:
    found = Search(task)
    pins = set(task.pins)
    pos = index.position.get(next(iter(pins))) if len(pins) == 1 else None
    if pos is None:
        return found  # pinned to an unknown node, or to two: every node is elsewhere
    found.pinned = pos
    node = index.nodes[pos]
    verdict, fit = check_node(task, node, ledger.usage_on(node.id), quota=quota)
    if fit is not None:
        found.fits.append(fit)
    else:
        found.failed[pos] = verdict
    return found


def seeded_walk(lists: Sequence[Sequence[int]], rng: random.Random) -> Iterator[int]:
    """Every item of `lists` once: each list from a seeded offset, round-robin over the lists
    in a seeded order (nodes of several classes interleave instead of one class first)."""
    if not lists:
        return
    if len(lists) == 1:
        items = lists[0]
        n = len(items)
        off = rng.randrange(n)
        for i in range(n):
            yield items[(off + i) % n]
        return
    order = list(range(len(lists)))
    rng.shuffle(order)
    cursors = [(lists[i], rng.randrange(len(lists[i]))) for i in order]
    rounds = max(len(items) for items, _ in cursors)
    for i in range(rounds):
        for items, off in cursors:
            if i < len(items):
                yield items[(off + i) % len(items)]


# --- why not -------------------------------------------------------------------------


@dataclass
class Tally:
    """How many nodes failed with each reason, and the first of them by id."""

    counts: dict[Reason, int] = field(default_factory=dict)
    first: dict[Reason, int] = field(default_factory=dict)

    def add(self, reason: Reason, count: int, first: int | None) -> None:
        if count <= 0 or first is None:
            return
        self.counts[reason] = self.counts.get(reason, 0) + count
        if reason not in self.first or first < self.first[reason]:
            self.first[reason] = first

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def tally(index: ClusterIndex, ledger: Ledger, found: Search) -> Tally:
    """Every node's reason, for a search that found no fit."""
    out = Tally()
    if found.task.pins:
        first_other = 1 if found.pinned == 0 else 0
        elsewhere = len(index) - (found.pinned is not None)
        out.add(Reason.PINNED_ELSEWHERE, elsewhere, first_other if elsewhere else None)
        for pos, verdict in found.failed.items():
            out.add(_reason(verdict), 1, pos)
        return out
    start = start_key(found.task)
    low = below_start_reason(found.task)
    for cls in index.classes:
        if not cls.online:
            out.add(Reason.NODE_OFFLINE, len(cls.positions), cls.positions[0])
            continue
        excl = sorted(p for p in found.excluded if index.class_of[p] == cls.id)
        if excl:
            out.add(Reason.NODE_EXCLUDED, len(excl), excl[0])
        reason = index.static_reason(cls, found.task)
        if reason is not None:
            out.add(reason, len(cls.positions) - len(excl), _first(cls.positions, found.excluded))
            continue
        _tally_buckets(out, ledger, cls, start, low, excl)
    for pos, verdict in found.failed.items():
        out.add(_reason(verdict), 1, pos)
    return out


def _tally_buckets(
    out: Tally, ledger: Ledger, cls: NodeClass, start: int, low: Reason, excl: Sequence[int]
) -> None:
    """The class's nodes below the walk's first bucket; `excl`: its excluded nodes."""
    skip = frozenset(excl)
    for key, positions in ledger.buckets[cls.id].items():
        if key >= start:
            continue  # walked: these nodes are in `failed`
        n_excl = sum(1 for p in excl if ledger.key_of[p] == key)
        out.add(low, len(positions) - n_excl, _first(positions, skip))


def reason_at(index: ClusterIndex, ledger: Ledger, found: Search, pos: int) -> Reason:
    """The reason of one node, for a search that found no fit."""
    if pos in found.failed:
        return _reason(found.failed[pos])
    if found.task.pins:
        return Reason.PINNED_ELSEWHERE
    cls = index.classes[index.class_of[pos]]
    if not cls.online:
        return Reason.NODE_OFFLINE
    if pos in found.excluded:
        return Reason.NODE_EXCLUDED
    return index.static_reason(cls, found.task) or below_start_reason(found.task)


def _first(positions: Sequence[int], excluded: frozenset[int]) -> int | None:
    return next((p for p in positions if p not in excluded), None)


def _reason(verdict: Verdict) -> Reason:
    assert verdict.reason is not None
    return verdict.reason
