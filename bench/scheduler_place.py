"""The scheduler suite's placement part: committed placements on a registered fleet.

A simulated fleet is registered as `node_registered` events (batched), pending tasks of mixed
shapes are created with `create_tasks`, then `Placer.round()` runs until a round places
nothing. A placement counts once its CAS transition to `scheduled` has committed.
"""

from __future__ import annotations

import time
import tracemalloc
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psutil
from psycopg.types.json import Jsonb

from agent.simulated_fleet import fleet_inventories
from libs.bus.nats import connect
from libs.domain.node.events import NodeRegistered
from libs.domain.node.evolve import evolve_node
from libs.domain.node.model import NodeInventory
from libs.domain.payload import Payload
from libs.domain.pool.events import PoolCreated, QueueCreated
from libs.domain.pool.model import (
    NodeSelector,
    PoolSpec,
    QueueQuota,
    QueueSpec,
    pool_stream,
    queue_stream,
)
from libs.domain.task.model import TaskSpec, TenantId
from libs.store import projections
from libs.store.eventstore import INSERT_EVENT, EventStore
from libs.store.pool import rows as query
from libs.store.projections import NODES, POOLS, QUEUES
from libs.store.relay import OutboxRelay
from services.scheduler import view
from services.scheduler.controllers.placement import Placer
from services.scheduler.placement.planner import Planner

TENANT = TenantId("bench")
CREATE_BATCH = 500
REGISTER_BATCH = 1_000
ROUND_BATCH = 512
NAN = float("nan")
MB = 1024 * 1024

# The mix of a placement run, in turns: (gpu_required, gpu_type, gpu_memory_mb).
MIX: tuple[tuple[int, str, int], ...] = (
    (1, "", 0),
    (1, "A100", 0),
    (1, "", 0),
    (2, "nvidia", 0),
    (1, "amd", 0),
    (1, "", 0),
    (1, "Ascend910B", 0),
    (0, "", 8_192),
    (1, "", 0),
    (4, "nvidia", 0),
)
# The end-to-end runs: one card of any kind.
STEADY_SPEC = TaskSpec(name="bench", image="sim:latest", gpu_required=1)


def task_specs(n: int) -> list[TaskSpec]:
    """`n` task specs, the shapes of MIX in turn."""
    shapes = [
        TaskSpec(
            name="bench",
            image="sim:latest",
            gpu_required=gpus,
            gpu_type=gpu_type,
            gpu_memory_mb=vram,
        )
        for gpus, gpu_type, vram in MIX
    ]
    return [shapes[i % len(shapes)] for i in range(n)]


async def register_nodes(
    store: EventStore, nodes: Sequence[tuple[str, NodeInventory]], batch: int = REGISTER_BATCH
) -> None:
    """`node_registered` events and node rows, `batch` nodes per transaction.

    What `ReportHandler.register` does one node per transaction, batched so that a 10,000-node
    fleet is ready in seconds.
    """
    insert = INSERT_EVENT.replace("RETURNING position", "")
    for start in range(0, len(nodes), batch):
        at = store.clock()
        events, docs = [], []
        for node_id, inventory in nodes[start : start + batch]:
            ev = NodeRegistered(node_id=node_id, inventory=inventory)
            data = Jsonb(ev.model_dump(mode="json"))
            events.append(
                (
                    uuid.uuid4(),
                    node_id,
                    ev.stream_type,
                    1,
                    ev.type,
                    ev.schema_version,
                    data,
                    Jsonb({}),
                    at,
                )
            )
            docs.append(evolve_node(None, ev, at, 1))
        async with store.pool.connection() as conn, conn.transaction():
            async with conn.cursor() as cur:
                await cur.executemany(insert, events)
            await projections.upsert(conn, NODES, docs)


async def create_pending(store: EventStore, specs: Sequence[TaskSpec]) -> None:
    for start in range(0, len(specs), CREATE_BATCH):
        await store.create_tasks(
            [(TENANT, s, None, None) for s in specs[start : start + CREATE_BATCH]]
        )


def _new(event: Payload) -> Callable[[Any], list[Payload]]:
    return lambda _: [event]


async def create_queues(store: EventStore, n: int, n_tasks: int) -> list[str]:
    """`n` queues of the bench tenant over two pools that both select the whole fleet (one by
    label, one by card vendor list), with quotas that never bind: what the run measures is
    the cost of admission and of pool membership, not of waiting on a quota."""
    pools = [
        PoolSpec(name="fleet", node_selector=NodeSelector(labels={"fleet": "sim"})),
        PoolSpec(name="any", node_selector=NodeSelector()),
    ]
    for pool in pools:
        await store.execute_aggregate(POOLS, pool_stream(pool.name), _new(PoolCreated(spec=pool)))
    names = [f"q{i}" for i in range(n)]
    for i, name in enumerate(names):
        spec = QueueSpec(
            name=name,
            tenant=TENANT,
            pools=(pools[i % 2].name,),
            quota=QueueQuota(max_gpus=4 * n_tasks, max_running_tasks=n_tasks),
            priority=i % 3,
        )
        await store.execute_aggregate(QUEUES, queue_stream(name), _new(QueueCreated(spec=spec)))
    return names


def in_queues(specs: Sequence[TaskSpec], queues: Sequence[str]) -> list[TaskSpec]:
    """The specs spread over `queues` in turn (unchanged without queues)."""
    if not queues:
        return list(specs)
    return [s.model_copy(update={"queue": queues[i % len(queues)]}) for i, s in enumerate(specs)]


@dataclass
class PlacementResult:
    nodes: int
    tasks: int
    queues: int = 0
    placed: int = 0
    rounds: int = 0
    seconds: float = 0.0
    plan_seconds: float = 0.0
    left_pending: int = 0
    cold_load_seconds: float = 0.0
    rss_after: float = NAN  # MiB, the whole bench process
    view_size: float = NAN  # MiB, tracemalloc: the scheduler's view of the fleet, held
    plan_peak: float = NAN  # MiB, tracemalloc: one plan() at its peak
    drained: int = 0  # events relayed to JetStream afterwards
    drain_seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.placed / self.seconds if self.seconds else 0.0


async def place_all(placer: Placer, result: PlacementResult, max_rounds: int = 10_000) -> None:
    """`Placer.round()` until a round places nothing (all placed, or the rest cannot be)."""
    start = time.perf_counter()
    while result.rounds < max_rounds:
        r = await placer.round()
        result.rounds += 1
        result.placed += r.placed
        result.plan_seconds += r.plan_seconds
        if r.placed == 0:
            break
    result.seconds = time.perf_counter() - start
    rows = await query(placer.store, "SELECT count(*) AS n FROM tasks WHERE status = 'pending'")
    result.left_pending = int(rows[0]["n"])


async def plan_peak(placer: Placer) -> float:
    """tracemalloc peak (MiB) of one plan of a full batch, its index built afresh."""
    pending = await view.load_pending(placer.store, ROUND_BATCH)
    snap = placer.cluster.snapshot(datetime.now(UTC), {})
    tracemalloc.start()
    try:
        # A planner of its own: nothing of the placer's index is reused. (Before 2026-12-02
        # this row reused it: `tuple()` of a tuple is the same object, so the index cached
        # for the nodes tuple was found again, and the row measured a warm index.)
        Planner().plan(snap, [view.pending_of(t) for t in pending], max_batch=ROUND_BATCH)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / MB


async def view_size(store: EventStore) -> float:
    """MiB a scheduler's `ClusterView` holds once it has read the fleet (tracemalloc)."""
    tracemalloc.start()
    try:
        cluster = view.ClusterView()
        await cluster.refresh(store)
        size, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return size / MB


async def drain_events(url: str, nats_url: str) -> tuple[int, float]:
    """Relay every event of the run to JetStream at once: (events, seconds)."""
    nc = await connect(nats_url, "bench-drain")
    try:
        relay = OutboxRelay(url, nc.jetstream(), name="bench-drain")
        try:
            start = time.perf_counter()
            n = await relay.run_once()
            return n, time.perf_counter() - start
        finally:
            await relay.close()
    finally:
        await nc.drain()


def _rss() -> float:
    return float(psutil.Process().memory_info().rss) / MB


async def placement_run(
    url: str, nats_url: str, n_nodes: int, n_tasks: int, *, drain: bool = False, queues: int = 0
) -> PlacementResult:
    result = PlacementResult(n_nodes, n_tasks, queues)
    store = await EventStore.open(url, max_size=4)
    try:
        await register_nodes(store, fleet_inventories(n_nodes))
        names = await create_queues(store, queues, n_tasks) if queues else []
        await create_pending(store, in_queues(task_specs(n_tasks), names))
        placer = Placer(store, store.clock, batch=ROUND_BATCH)
        start = time.perf_counter()
        await placer.cluster.refresh(store)  # the first read of the fleet, not on the clock
        result.cold_load_seconds = time.perf_counter() - start
        await place_all(placer, result)
        result.rss_after = _rss()
        await create_pending(store, in_queues(task_specs(ROUND_BATCH), names))
        result.plan_peak = await plan_peak(placer)
        result.view_size = await view_size(store)
    finally:
        await store.close()
    if drain:
        result.drained, result.drain_seconds = await drain_events(url, nats_url)
    return result
