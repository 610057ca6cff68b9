"""The placement core: a ClusterSnapshot in, a Plan out (see docs/scheduling.md).

Pure: nothing here does I/O or imports a store, bus, container runtime or asyncio
(tests/unit/test_architecture.py checks it); the clock comes in with the snapshot and every
shuffle is seeded from the task id, so a decision replays.

`model` holds the values, `reasons` the named reasons, `feasibility` the usage and quota
arithmetic and the card grants, `stages` the feasibility stages as registered objects (each
with its name, the reason it rejects with, and whether it is static: cacheable per class of
identical nodes), `rankers` the named scores that order the nodes that fit, `planner` the
evaluation loop with preemption, gangs and host ports (`Planner`), `queues` the admission
limits of queues and pools and `loans` the lending of a sleeping task's cards. `index`,
`ledger` and `search` keep large fleets cheap: node classes, free-card buckets, and the walk
that checks only the nodes that can fit (docs/scheduling.md, "Large fleets"). `dryrun`,
`eta` and `waits` answer without placing: a submission planned node by node, and a pending
task's binding stage, place in line and estimated start (docs/scheduling.md, "Plan and ETA").
"""

from __future__ import annotations

from .model import (
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
)
from .planner import Planner, plan
from .reasons import Reason

__all__ = [
    "Allocation",
    "ClusterSnapshot",
    "Gpu",
    "GpuShare",
    "Node",
    "PendingTask",
    "Placement",
    "Plan",
    "Planner",
    "Preemption",
    "Qos",
    "Reason",
    "Requirement",
    "Unplaced",
    "plan",
]
