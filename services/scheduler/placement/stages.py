"""The feasibility stages as registered objects, and the chain that runs them in order.

Each stage has a `name`, the `reason` it reports when it rejects a node, and whether it is
`static`: its answer depends only on the node's class and the request (online, pool,
runtime, GPU type, VRAM), so the index answers it once per class of identical nodes
(index.py). Pin and exclusion read the node's id, the rest what the node runs (`usage`).
`STAGES` is the chain, in order; its order is also how close a node came to fitting
(`NODE_STAGE_ORDER`), which the planner uses to pick the most informative reason. The chain
stops at the first rejection.

The card stages (`whole_cards`, `fraction`) also grant the cards of a fit; only the one
that applies to the request runs. The tenant quota comes last, once the grant's cost is
known.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .feasibility import (
    Check,
    Fit,
    Grant,
    NodeUsage,
    Quota,
    allocate_fraction,
    allocate_whole,
    check_anti_affinity,
    check_cpu,
    check_excluded,
    check_gpu_type,
    check_memory,
    check_online,
    check_pin,
    check_pool,
    check_runtime,
    check_starts,
    check_vram,
    share_cost,
)
from .model import Node, PendingTask, Requirement
from .reasons import PASS, Reason, Verdict

Allocate = Callable[[PendingTask, Node, NodeUsage], tuple[Verdict, Grant | None]]


@dataclass(frozen=True, slots=True)
class Stage:
    """One check of the chain. `static`: cacheable per node class; `capacity`: reads what
    the node runs (`usage`), so it runs per node after the static ones."""

    name: str
    reason: Reason
    static: bool
    check: Check
    capacity: bool = False

    def __call__(self, task: PendingTask, node: Node, usage: NodeUsage) -> Verdict:
        return self.check(task, node, usage)


@dataclass(frozen=True, slots=True)
class CardStage:
    """A stage that grants cards: it runs for the requests it `applies` to."""

    name: str
    reason: Reason
    applies: Callable[[Requirement], bool]
    allocate: Allocate
    static: bool = False
    capacity: bool = True

    def __call__(self, task: PendingTask, node: Node, usage: NodeUsage) -> Verdict:
        if not self.applies(task.requirement):
            return PASS
        return self.allocate(task, node, usage)[0]


@dataclass(frozen=True, slots=True)
class QuotaStage:
    """The tenant's GPU quota against the cost of the cards granted on this node."""

    name: str
    reason: Reason
    static: bool = False
    capacity: bool = True

    def check(self, quota: Quota | None, cost: float) -> Verdict:
        if quota is not None and cost and not quota.allows(cost):
            return quota.rejection(cost)
        return PASS


PIN = Stage("pin", Reason.PINNED_ELSEWHERE, False, check_pin)
ONLINE = Stage("online", Reason.NODE_OFFLINE, True, check_online)
EXCLUDED = Stage("excluded", Reason.NODE_EXCLUDED, False, check_excluded)
POOL = Stage("pool", Reason.NOT_IN_POOL, True, check_pool)
RUNTIME = Stage("runtime", Reason.RUNTIME_UNAVAILABLE, True, check_runtime)
GPU_TYPE = Stage("gpu_type", Reason.GPU_TYPE_UNAVAILABLE, True, check_gpu_type)
VRAM = Stage("vram", Reason.INSUFFICIENT_VRAM, True, check_vram)
WHOLE_CARDS = CardStage(
    "whole_cards",
    Reason.INSUFFICIENT_GPUS,
    lambda req: req.gpu_count > 0,  # a fraction has no whole cards
    allocate_whole,
)
FRACTION = CardStage(
    "fraction", Reason.FRACTION_UNAVAILABLE, lambda req: req.is_fractional, allocate_fraction
)
MEMORY = Stage("memory", Reason.INSUFFICIENT_MEMORY, False, check_memory, capacity=True)
CPU = Stage("cpu", Reason.INSUFFICIENT_CPU, False, check_cpu, capacity=True)
ANTI_AFFINITY = Stage(
    "anti_affinity", Reason.ANTI_AFFINITY, False, check_anti_affinity, capacity=True
)
STARTS = Stage("starts_in_flight", Reason.STARTS_IN_FLIGHT, False, check_starts, capacity=True)
QUOTA = QuotaStage("tenant_quota", Reason.TENANT_QUOTA_EXCEEDED)

# The chain, in order.
STAGES: tuple[Stage | CardStage | QuotaStage, ...] = (
    PIN,
    ONLINE,
    EXCLUDED,
    POOL,
    RUNTIME,
    GPU_TYPE,
    VRAM,
    WHOLE_CARDS,
    FRACTION,
    MEMORY,
    CPU,
    ANTI_AFFINITY,
    STARTS,
    QUOTA,
)
NODE_STAGE_ORDER: tuple[Reason, ...] = tuple(s.reason for s in STAGES)
# The stages that read the node alone (before any usage), those the index caches per class,
# the card grants and the capacity checks that follow a grant.
NODE_STAGES: tuple[Stage, ...] = tuple(s for s in STAGES if isinstance(s, Stage) and not s.capacity)
STATIC_STAGES: tuple[Stage, ...] = tuple(s for s in NODE_STAGES if s.static)
CARD_STAGES: tuple[CardStage, ...] = tuple(s for s in STAGES if isinstance(s, CardStage))
LATE_STAGES: tuple[Stage, ...] = tuple(s for s in STAGES if isinstance(s, Stage) and s.capacity)

# The node stages never look at usage.
_NO_USAGE = NodeUsage()


def check_static(task: PendingTask, node: Node) -> Verdict:
    """The stages that depend only on the node itself (pin, online, exclusion, pool, runtime,
    type, VRAM)."""
    for stage in NODE_STAGES:
        verdict = stage.check(task, node, _NO_USAGE)
        if not verdict.ok:
            return verdict
    return PASS


def allocate_gpus(task: PendingTask, node: Node, usage: NodeUsage) -> tuple[Verdict, Grant | None]:
    """The cards `task` gets on `node` from the card stage that applies (none: no cards)."""
    req = task.requirement
    for stage in CARD_STAGES:
        if stage.applies(req):
            return stage.allocate(task, node, usage)
    return PASS, _NO_CARDS


_NO_CARDS = Grant()


def check_capacity(
    task: PendingTask,
    node: Node,
    usage: NodeUsage,
    *,
    quota: Quota | None,
) -> tuple[Verdict, Fit | None]:
    """The stages that depend on what the node runs (cards, memory, CPU, anti-affinity,
    starts, quota), for a node that passed `check_static`. On success return the Fit."""
    verdict, grant = allocate_gpus(task, node, usage)
    if grant is None:
        return verdict, None
    for stage in LATE_STAGES:
        verdict = stage.check(task, node, usage)
        if not verdict.ok:
            return verdict, None
    if grant.fractions:
        gpus = {g.id: g for g in node.gpus}
        cost = sum(share_cost(s, gpus) for s in grant.fractions)
    else:
        cost = float(len(grant.gpu_ids))
    verdict = QUOTA.check(quota, cost)
    if not verdict.ok:
        return verdict, None
    return PASS, Fit(node=node, usage=usage, grant=grant, cost=cost)


def check_node(
    task: PendingTask,
    node: Node,
    usage: NodeUsage,
    *,
    quota: Quota | None,
) -> tuple[Verdict, Fit | None]:
    """Run every stage in order; the first rejection wins. On success return the Fit."""
    verdict = check_static(task, node)
    if not verdict.ok:
        return verdict, None
    return check_capacity(task, node, usage, quota=quota)
