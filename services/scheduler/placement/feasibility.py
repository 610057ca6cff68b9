"""Feasibility arithmetic: what a node holds, what a task costs, which cards it would get.

The checks here are plain functions `(task, node, usage) -> Verdict`; stages.py registers
them as the ordered stages of the chain (with each one's name, reason and whether it is
static) and runs the chain. Task-level checks (backoff, tenant quota floor) run once per
task, before any node. `allocate_whole` and `allocate_fraction` pick the cards of a fit:
whole cards best-fit, a fraction on the fullest card with room.

Usage is computed from allocations whose status is in GPU_HOLDING, the one definition of
what counts against capacity and quota.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from libs.domain.task.states import TaskStatus

from .model import (
    Allocation,
    Gpu,
    GpuShare,
    Node,
    PendingTask,
    Qos,
    derive_qos,
    gpu_matches,
    share_on,
)
from .reasons import PASS, Reason, Verdict, reject

# Float slack for summed compute shares (0.1 + 0.2 + 0.7 must fit on one card).
EPS = 1e-9

# --- usage ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CardUse:
    whole: bool = False
    vram_mb: int = 0
    compute_ratio: float = 0.0


_UNUSED = CardUse()


@dataclass(frozen=True, slots=True)
class NodeUsage:
    cards: Mapping[str, CardUse] = field(default_factory=dict)  # only cards with any use
    memory_mb: int = 0
    cpu_cores: float = 0.0
    affinity: frozenset[tuple[str, str]] = frozenset()  # (tenant, anti-affinity key)
    starting: int = 0  # tasks placed here and not yet running (STARTING_STATUSES)


_WHOLE = CardUse(whole=True)

# Placed on a node and not yet running: the starts the node has in flight.
STARTING_STATUSES: frozenset[TaskStatus] = frozenset({TaskStatus.SCHEDULED, TaskStatus.STARTING})


def usage_of(allocations: Iterable[Allocation]) -> NodeUsage:
    cards: dict[str, CardUse] = {}
    memory, cpu, starting = 0, 0.0, 0
    keys: set[tuple[str, str]] = set()
    for a in allocations:
        if not a.holding:
            continue
        memory += a.memory_mb
        cpu += a.cpu_cores
        starting += a.status in STARTING_STATUSES
        if a.anti_affinity:
            keys.update((a.tenant_id, k) for k in a.anti_affinity)
        if a.is_fractional:
            for s in a.fractions:
                c = cards.get(s.gpu_id, _UNUSED)
                cards[s.gpu_id] = CardUse(
                    c.whole, c.vram_mb + s.vram_mb, c.compute_ratio + s.compute_ratio
                )
        else:
            for gid in a.gpu_ids:
                c = cards.get(gid, _UNUSED)
                # Most cards are held by one whole-card task: share one value for them.
                whole = _WHOLE if c is _UNUSED or c is _WHOLE else None
                cards[gid] = whole or CardUse(True, c.vram_mb, c.compute_ratio)
    return NodeUsage(cards, memory, cpu, frozenset(keys), starting)


def free_whole_cards(node: Node, usage: NodeUsage) -> int:
    return sum(1 for g in node.gpus if not g.excluded and g.id not in usage.cards)


# --- quota ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Quota:
    """A tenant's GPU quota in cards and what it holds now (this round's placements included)."""

    tenant_id: str
    limit: float
    used: float
    surge: float = 0.0  # a rolling update's surge allowance, over the limit

    def allows(self, cost: float) -> bool:
        return self.used + cost <= self.limit + self.surge + EPS

    def rejection(self, cost: float) -> Verdict:
        extra = f" plus a rollout surge allowance of {self.surge:g}" if self.surge else ""
        return reject(
            Reason.TENANT_QUOTA_EXCEEDED,
            f"tenant {self.tenant_id!r} GPU quota is {self.limit:g} card(s){extra}: "
            f"{self.used:g} held, this task needs {cost:g}",
        )


def share_cost(share: GpuShare, gpus: Mapping[str, Gpu]) -> float:
    """Quota cost of a fraction: the larger of its compute share and its VRAM share."""
    gpu = gpus.get(share.gpu_id)
    vram_share = share.vram_mb / gpu.vram_mb if gpu and gpu.vram_mb else 0.0
    return max(share.compute_ratio, vram_share)


def allocation_cost(a: Allocation, gpus: Mapping[str, Gpu]) -> float:
    if a.is_fractional:
        return sum(share_cost(s, gpus) for s in a.fractions)
    return float(len(a.gpu_ids))


def floor_cost(task: PendingTask) -> float:
    """The least a task can cost before we know its card (exact for whole cards)."""
    req = task.requirement
    return float(req.gpu_count) if req.gpu_count else req.gpu_compute_ratio


# --- task-level checks ---------------------------------------------------------------


def check_backoff(task: PendingTask, now: datetime) -> Verdict:
    if task.not_before is not None and now < task.not_before:
        return reject(
            Reason.BACKOFF, f"retry backoff: not placeable before {task.not_before.isoformat()}"
        )
    return PASS


def check_quota_floor(task: PendingTask, quota: Quota | None) -> Verdict:
    cost = floor_cost(task)
    if quota is None or cost == 0 or quota.allows(cost):
        return PASS
    return quota.rejection(cost)


# --- node stages ---------------------------------------------------------------------

Check = Callable[[PendingTask, Node, NodeUsage], Verdict]


def check_pin(task: PendingTask, node: Node, usage: NodeUsage) -> Verdict:
    for pin in task.pins:
        if node.id != pin:
            return reject(Reason.PINNED_ELSEWHERE, f"task is pinned to node {pin!r}")
    return PASS


def check_online(task: PendingTask, node: Node, usage: NodeUsage) -> Verdict:
    if not node.online:
        return reject(Reason.NODE_OFFLINE, f"node {node.id!r} is offline")
    return PASS


def check_excluded(task: PendingTask, node: Node, usage: NodeUsage) -> Verdict:
    if node.id in task.excluded_node_ids:
        return reject(
            Reason.NODE_EXCLUDED, f"node {node.id!r} is excluded for this task (earlier failure)"
        )
    return PASS


def check_pool(task: PendingTask, node: Node, usage: NodeUsage) -> Verdict:
    """A queue's task goes only to nodes of the queue's pools (queues.py)."""
    if not task.pools or node.pools & task.pools:
        return PASS
    names = ", ".join(sorted(task.pools))
    return reject(Reason.NOT_IN_POOL, f"node {node.id!r} is not in pool(s) {names}")


def check_runtime(task: PendingTask, node: Node, usage: NodeUsage) -> Verdict:
    """A task that names a runtime (no image: `process`) goes only to nodes running it."""
    wanted = task.requirement.runtime
    if not wanted or node.runtime == wanted:
        return PASS
    return reject(
        Reason.RUNTIME_UNAVAILABLE,
        f"node {node.id!r} runs the {node.runtime or 'unknown'} runtime; a task without an "
        f"image needs a {wanted} node",
    )


def check_gpu_type(task: PendingTask, node: Node, usage: NodeUsage) -> Verdict:
    req = task.requirement
    if not req.needs_gpu or not req.gpu_type:
        return PASS
    if any(gpu_matches(g, req.gpu_type) for g in node.gpus):
        return PASS
    return reject(
        Reason.GPU_TYPE_UNAVAILABLE, f"node {node.id!r} has no GPU of type {req.gpu_type!r}"
    )


def _typed_and_suitable(task: PendingTask, node: Node) -> tuple[tuple[Gpu, ...], tuple[Gpu, ...]]:
    req = task.requirement
    frac_vram = req.gpu_memory_mb if req.is_fractional else 0
    return node.cards_for(req.gpu_type, task.required_min_vram_mb, frac_vram)


def _vram_need(task: PendingTask) -> str:
    parts = []
    if task.required_min_vram_mb:
        parts.append(f"more than {task.required_min_vram_mb} MB")
    if task.requirement.is_fractional and task.requirement.gpu_memory_mb:
        parts.append(f"at least {task.requirement.gpu_memory_mb} MB")
    return " and ".join(parts)


def _kind(task: PendingTask) -> str:
    t = task.requirement.gpu_type
    return f"{t!r} GPU(s)" if t else "GPU(s)"


def _suitable(task: PendingTask, node: Node) -> tuple[Gpu, ...]:
    """Cards of the wanted type, not excluded, with enough VRAM."""
    return _typed_and_suitable(task, node)[1]


def check_vram(task: PendingTask, node: Node, usage: NodeUsage) -> Verdict:
    req = task.requirement
    if not req.needs_gpu:
        return PASS
    need = req.gpu_count or 1
    typed, big = _typed_and_suitable(task, node)
    if len(typed) >= need and len(big) < need:
        return reject(
            Reason.INSUFFICIENT_VRAM,
            f"node {node.id!r} has {len(big)} {_kind(task)} with {_vram_need(task)} VRAM, "
            f"task needs {need}",
        )
    return PASS


def check_memory(task: PendingTask, node: Node, usage: NodeUsage) -> Verdict:
    free = node.memory_mb - usage.memory_mb
    if task.requirement.memory_mb > free:
        return reject(
            Reason.INSUFFICIENT_MEMORY,
            f"node {node.id!r} has {free} MB memory free, task needs {task.requirement.memory_mb}",
        )
    return PASS


def check_cpu(task: PendingTask, node: Node, usage: NodeUsage) -> Verdict:
    free = node.cpu_cores - usage.cpu_cores
    if task.requirement.cpu_cores > free + EPS:
        return reject(
            Reason.INSUFFICIENT_CPU,
            f"node {node.id!r} has {free:g} CPU cores free, task needs "
            f"{task.requirement.cpu_cores:g}",
        )
    return PASS


def check_anti_affinity(task: PendingTask, node: Node, usage: NodeUsage) -> Verdict:
    # Keys are scoped to the tenant: another tenant's key never blocks this task.
    for key in task.requirement.anti_affinity:
        if (task.tenant_id, key) in usage.affinity:
            return reject(
                Reason.ANTI_AFFINITY,
                f"node {node.id!r} already runs a task with anti-affinity key {key!r}",
            )
    return PASS


def check_starts(task: PendingTask, node: Node, usage: NodeUsage) -> Verdict:
    # Not a capacity reason: preemption frees nothing here, a start reaching running does.
    if node.max_starting and usage.starting >= node.max_starting:
        return reject(
            Reason.STARTS_IN_FLIGHT,
            f"node {node.id!r} is already starting {usage.starting} tasks "
            f"(limit {node.max_starting})",
        )
    return PASS


# --- GPU allocation ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Grant:
    """The cards chosen on one node: whole `gpu_ids`, or one fractional share."""

    gpu_ids: tuple[str, ...] = ()
    fractions: tuple[GpuShare, ...] = ()
    qos: Qos | None = None


def allocate_whole(task: PendingTask, node: Node, usage: NodeUsage) -> tuple[Verdict, Grant | None]:
    need = task.requirement.gpu_count
    suitable = _suitable(task, node)
    free = [g for g in suitable if g.id not in usage.cards]
    if len(free) < need:
        lost = sum(1 for g in node.gpus if g.excluded and gpu_matches(g, task.requirement.gpu_type))
        extra = f", {lost} excluded (lost)" if lost else ""
        return reject(
            Reason.INSUFFICIENT_GPUS,
            f"node {node.id!r} has {len(free)} free of {len(suitable)} suitable "
            f"{_kind(task)}{extra}, task needs {need}",
        ), None
    # `suitable` is smallest card first, so this is a best fit.
    return PASS, Grant(gpu_ids=tuple(g.id for g in free[:need]))


def fill_after(gpu: Gpu, use: CardUse, share: GpuShare) -> float:
    """How full a card is once `share` is added (the larger of VRAM and compute fill)."""
    return max((use.vram_mb + share.vram_mb) / gpu.vram_mb, use.compute_ratio + share.compute_ratio)


def allocate_fraction(
    task: PendingTask, node: Node, usage: NodeUsage
) -> tuple[Verdict, Grant | None]:
    req = task.requirement
    options: list[tuple[float, int, Gpu, GpuShare]] = []
    for g in _suitable(task, node):
        use = usage.cards.get(g.id, CardUse())
        share = share_on(req, g)
        if use.whole or use.vram_mb + share.vram_mb > g.vram_mb:
            continue
        if use.compute_ratio + share.compute_ratio > 1.0 + EPS:
            continue
        options.append((-fill_after(g, use, share), g.index, g, share))
    if not options:
        return reject(
            Reason.FRACTION_UNAVAILABLE,
            f"node {node.id!r} has no {_kind(task)} with room for {_fraction_text(task)}",
        ), None
    # Fullest card first, so whole cards stay free for whole-card work.
    _, _, gpu, share = min(options, key=lambda o: (o[0], o[1]))
    return PASS, Grant(gpu_ids=(gpu.id,), fractions=(share,), qos=derive_qos(gpu))


def _fraction_text(task: PendingTask) -> str:
    req = task.requirement
    parts = []
    if req.gpu_memory_mb:
        parts.append(f"{req.gpu_memory_mb} MB VRAM")
    if req.gpu_compute_ratio:
        parts.append(f"{req.gpu_compute_ratio:.0%} compute")
    return " and ".join(parts)


# --- a fit -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fit:
    """A node that can take the task, with the cards it would get and the quota it costs."""

    node: Node
    usage: NodeUsage
    grant: Grant
    cost: float
