"""Placement: a ClusterSnapshot in, a Plan out, no I/O inside (see docs/scheduling.md).

`model` holds the values, `feasibility` the per-node checks, `scoring` the ranking,
`planner` the evaluation loop with preemption and gangs, `reasons` the named reasons.
`index`, `ledger` and `search` keep large fleets cheap: node classes, free-card buckets, and
the walk that checks only the nodes that can fit (see docs/scheduling.md, "Large fleets").
"""

from __future__ import annotations

from .placement import (
    Allocation,
    ClusterSnapshot,
    Gpu,
    GpuShare,
    Node,
    PendingTask,
    Placement,
    Plan,
    Preemption,
    Qos,
    Requirement,
    Unplaced,
    plan,
)
from .placement.reasons import Reason

__all__ = [
    "Allocation",
    "ClusterSnapshot",
    "Gpu",
    "GpuShare",
    "Node",
    "PendingTask",
    "Placement",
    "Plan",
    "Preemption",
    "Qos",
    "Reason",
    "Requirement",
    "Unplaced",
    "plan",
]
