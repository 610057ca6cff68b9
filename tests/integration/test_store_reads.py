"""Store read functions that carry logic, against a real PostgreSQL: the retry engine's
two-node read answers as the whole fleet would, and driver failures surface as the
project's own errors."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from libs.domain.errors import StoreUnavailable
from libs.domain.node.events import NodeOffline, NodeRegistered
from libs.domain.node.model import GpuCard, Node, NodeInventory
from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.task.model import Task, TaskId, TaskSpec, TenantId
from libs.domain.task.states import TaskStatus
from libs.store import nodes as node_rows
from libs.store import tasks as task_rows
from libs.store.eventstore import EventStore
from libs.store.pool import StorePool
from libs.store.projections import NODES
from services.retry_engine.decide import Evidence, RetryConfig, decide_retry
from services.retry_engine.service import node_facts

pytestmark = pytest.mark.integration

AT = datetime(2026, 1, 1, tzinfo=UTC)
# id -> (card sizes in MB, online)
FLEET = {
    "small": ((8192,), True),
    "mid": ((8192, 16384), True),
    "big": ((24576,), True),
    "dead": ((81920,), False),
    "bare": ((), True),
}


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[EventStore]:
    st = await EventStore.open(database_url, max_size=4)
    for node_id, (cards, online) in FLEET.items():
        gpus = tuple(
            GpuCard(id=f"{node_id}-g{i}", index=i, vendor="nvidia", model="x", vram_mb=mb)
            for i, mb in enumerate(cards)
        )
        inv = NodeInventory(memory_mb=65_536, cpu_cores=8, gpus=gpus)
        events: list[Payload] = [NodeRegistered(node_id=node_id, inventory=inv)]
        if not online:
            events.append(
                NodeOffline(node_id=node_id, silent_seconds=30.0, reason_code=ReasonCode.NODE_LOST)
            )
        await st.execute_aggregate(NODES, node_id, _these(events))
    yield st
    await st.close()


def _these(events: list[Payload]) -> Callable[[Node | None], list[Payload]]:
    return lambda _node: events


@pytest.mark.parametrize(
    ("failed_on", "expected"),
    [
        ("small", ["small", "big"]),
        ("big", ["big", "mid"]),
        ("dead", ["dead", "big"]),
        ("", ["big"]),
        ("unknown", ["big"]),
    ],
    ids=["small", "biggest-online", "offline-node", "no-node", "unknown-node"],
)
async def test_best_alternative_is_the_largest_online_card_elsewhere(
    store: EventStore, failed_on: str, expected: list[str]
) -> None:
    found = await node_rows.with_best_alternative(store, failed_on)
    assert [n.id for n in found] == expected


def failed_on(node_id: str, strategy: str) -> Task:
    spec = TaskSpec.model_validate({"name": "t", "image": "x", "retry_strategy": strategy})
    cards = FLEET.get(node_id, ((), True))[0]
    return Task(
        id=TaskId("t"),
        tenant_id=TenantId("a"),
        spec=spec,
        status=TaskStatus.FAILED,
        node_id=node_id or None,
        gpu_ids=(f"{node_id}-g0",) if cards else (),
        created_at=AT,
        updated_at=AT,
    )


EVIDENCE = {
    "gpu-oom": Evidence(None, False, "", "", "CUDA out of memory", AT),
    "cpu-oom": Evidence(137, True, "", "", "", AT),
    "plain": Evidence(1, False, "", "", "", AT),
}


@pytest.mark.parametrize("strategy", ["retry_new_node", "retry_same_node"])
@pytest.mark.parametrize("evidence", sorted(EVIDENCE))
async def test_two_nodes_decide_as_the_whole_fleet(
    store: EventStore, evidence: str, strategy: str
) -> None:
    """The reduction is only sound if no decision changes: every failed node, every kind."""
    cfg = RetryConfig(retry_delay_s=30, backoff_multiplier=2, oom_memory_limit_mb=16384)
    fleet = {n.id: node_facts(n) for n in await node_rows.all_nodes(store)}
    for node_id in [*FLEET, ""]:
        task = failed_on(node_id, strategy)
        pair = await node_rows.with_best_alternative(store, node_id)
        reduced = {n.id: node_facts(n) for n in pair}
        assert decide_retry(task, EVIDENCE[evidence], cfg, reduced) == decide_retry(
            task, EVIDENCE[evidence], cfg, fleet
        ), node_id


async def test_an_unreachable_database_is_store_unavailable() -> None:
    pool = StorePool(
        "postgresql://127.0.0.1:9/none", min_size=0, max_size=1, open=False, timeout=0.5
    )
    await pool.open(wait=False)
    try:
        with pytest.raises(StoreUnavailable):
            await task_rows.pending(EventStore(pool), 10)
    finally:
        await pool.close()


async def test_migrating_an_unreachable_database_is_store_unavailable() -> None:
    with pytest.raises(StoreUnavailable):
        await EventStore.open("postgresql://127.0.0.1:9/none?connect_timeout=1")


async def test_a_lent_card_counts_once_in_the_tenants_gpus(store: EventStore) -> None:
    """The AutoScaler's headroom read (`tenant_gpus`): a borrower's card is its sleeping
    lender's while the lender holds it, and its own once the lender has gone."""
    from libs.domain.task.decide import decide_transition
    from libs.domain.task.lending import decide_borrow, decide_lend, measure_sleep
    from libs.domain.task.states import Actor

    tenant = TenantId("lend-" + datetime.now(UTC).strftime("%H%M%S%f"))
    lender = await store.create_task(tenant, TaskSpec(name="engine", gpu_required=1))
    borrower = await store.create_task(tenant, TaskSpec(name="train", gpu_required=1))

    def move(to: TaskStatus, **kw: Any) -> Callable[[Task], list[Payload]]:
        return lambda t: list(
            decide_transition(t, to, actor=Actor.SCHEDULER, reason_code=ReasonCode.REPORTED, **kw)
        )

    await store.execute(lender.id, move(TaskStatus.SCHEDULED, node_id="big", gpu_ids=("big-g0",)))
    await store.execute(lender.id, move(TaskStatus.RUNNING))
    await store.execute(lender.id, move(TaskStatus.SLEEPING))
    await store.execute(lender.id, lambda t: [measure_sleep(t, "big", "engine", 100, 10, 0.6)])
    assert await task_rows.tenant_gpus(store, tenant) == 2.0  # the borrower waits: counted
    await store.execute(lender.id, lambda t: decide_lend(t, borrower.id, "big", ("big-g0",)))
    await store.execute(
        borrower.id, lambda t: decide_borrow(t, lender.id, "big", ("big-g0",), "nvidia/x")
    )
    assert await task_rows.tenant_gpus(store, tenant) == 1.0
    assert lender.id in [t.id for t in await task_rows.lenders(store)]
    await store.execute(lender.id, move(TaskStatus.STOPPING))
    await store.execute(lender.id, move(TaskStatus.STOPPED))
    assert await task_rows.tenant_gpus(store, tenant) == 1.0  # now the borrower's own card
    assert lender.id not in [t.id for t in await task_rows.lenders(store)]
