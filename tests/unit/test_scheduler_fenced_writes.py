"""The scheduler's controllers write through their term's FencedWriter, also where the write
is made outside the term's own task (the node monitor's heartbeat handler), so no write of a
term can go out without its fence."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from libs.controller import Term
from libs.domain.node.model import Node, NodeInventory, NodeStatus
from libs.domain.payload import Payload
from libs.domain.protocol import Heartbeat
from libs.store.fenced import FencedWriter
from libs.store.fencing import TERM_FENCE, Fence
from services.scheduler.controllers.groups import GroupController, policy_from
from services.scheduler.controllers.node_monitor import NodeMonitor
from services.scheduler.controllers.placement import PlacementController, Placer

AT = datetime(2026, 1, 1, tzinfo=UTC)
FENCE = Fence("node-monitor", 4)


class RecordingStore:
    """Stands in for the store's node writes: records the fence each one carries."""

    def __init__(self) -> None:
        self.fences: list[Fence | None] = []
        self.clock = lambda: AT

    async def execute_aggregate(
        self,
        agg: Any,
        agg_id: str,
        decide: Callable[[Any], Sequence[Payload]],
        *,
        metadata: dict[str, Any] | None = None,
        fence: Fence | None = None,
        receipt: Any = None,
    ) -> None:
        self.fences.append(fence)
        return None


class Monitor(NodeMonitor):
    async def refresh(self) -> None:  # no projection to read here
        return None


async def test_a_heartbeat_write_carries_the_terms_fence() -> None:
    store = RecordingStore()
    monitor = Monitor(store, None)  # type: ignore[arg-type]
    await monitor.elected(Term(FENCE, 0.0, time.monotonic, store))  # type: ignore[arg-type]
    assert TERM_FENCE.get() is None, "the handler runs outside the term's context"
    inv = NodeInventory(memory_mb=1024, cpu_cores=1)
    monitor.nodes["n1"] = Node(
        id="n1",
        status=NodeStatus.OFFLINE,
        inventory=inv,
        version=2,
        registered_at=AT,
        updated_at=AT,
    )
    await monitor.heartbeat(Heartbeat(node_id="n1", seq=1, visible_gpus=[], at=AT))
    assert store.fences == [FENCE], "the node back online is written under the term's fence"


async def test_each_controller_takes_its_terms_writer() -> None:
    store = RecordingStore()
    term = Term(FENCE, 0.0, time.monotonic, store)  # type: ignore[arg-type]
    monitor = Monitor(store, None)  # type: ignore[arg-type]
    groups = GroupController(store, policy_from([1.0], 60, 600, 1), lambda: AT)  # type: ignore[arg-type]
    placer = Placer(store, lambda: AT)  # type: ignore[arg-type]

    class View:
        def invalidate(self) -> None:
            return None

    placer.cluster = View()  # type: ignore[assignment]
    placement = PlacementController(placer, wake=None)  # type: ignore[arg-type]
    for controller in (monitor, groups, placement):
        await controller.elected(term)
    for writes in (monitor.writes, groups.writes, placer.writes):
        assert isinstance(writes, FencedWriter) and writes.fence == FENCE
    # Without a term (a test or benchmark driving a pass by hand) the store's own writes.
    bare: Any = store
    assert Placer(bare, lambda: AT).writes is bare
