"""The scheduler service: places tasks (the pure core, `placement/`: a ClusterSnapshot in,
a Plan out, no I/O inside; docs/scheduling.md), dispatches them to the nodes and applies the
nodes' reports (`handlers/`), and runs the leader-only loops (`controllers/`). The
placement's values are re-exported here; `SERVICE` is built on first use, so importing the
placement imports none of the service's I/O modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from libs.service import ServiceSpec

    SERVICE: ServiceSpec


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


def __getattr__(name: str) -> Any:
    if name != "SERVICE":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from libs.bus import permissions as perms
    from libs.service import ServiceSpec, documented

    from . import service

    spec = ServiceSpec(
        name="scheduler",
        Settings=service.SchedulerSettings,
        run=service.run,
        routes=documented(service.routes),
        nats_user=perms.NatsUser("scheduler", may_publish=(perms.NODE_COMMANDS,)),
        lease_ttl_s=service.LEASE_TTL_S,
    )
    globals()["SERVICE"] = spec
    return spec
