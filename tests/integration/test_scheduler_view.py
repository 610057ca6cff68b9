"""The scheduler's incremental view against reading every row afresh, on a real PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from libs.domain.node.events import GpuLost, NodeRegistered
from libs.domain.node.model import GpuCard, NodeInventory
from libs.domain.reasons import ReasonCode
from libs.domain.task.decide import decide_transition
from libs.domain.task.model import Task, TaskSpec, TenantId
from libs.domain.task.states import Actor, TaskStatus
from libs.store.eventstore import EventStore
from libs.store.projections import NODES
from services.scheduler import view
from services.scheduler.controllers.placement import Placer
from services.scheduler.placement.ledger import Ledger
from services.scheduler.placement.model import Allocation, AllocationDelta, ClusterSnapshot, Node
from services.scheduler.placement.planner import Evaluation, Planner
from tests.unit.test_ledger_incremental import state

pytestmark = pytest.mark.integration

S = TaskStatus
T = TenantId("acme")
NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[EventStore]:
    st = await EventStore.open(database_url, max_size=4)
    yield st
    await st.close()


def inventory(node_id: str) -> NodeInventory:
    gpus = tuple(
        GpuCard(id=f"{node_id}-g{i}", index=i, vendor="nvidia", model="L4", vram_mb=24_576)
        for i in range(2)
    )
    return NodeInventory(memory_mb=65_536, cpu_cores=16, gpus=gpus)


async def register(store: EventStore, node_id: str) -> None:
    ev = NodeRegistered(node_id=node_id, inventory=inventory(node_id))
    await store.execute_aggregate(NODES, node_id, lambda _n: [ev])


async def place(store: EventStore, task_id: str, node_id: str, gpu: str) -> None:
    await store.execute(
        task_id,
        lambda t: decide_transition(
            t,
            S.SCHEDULED,
            actor=Actor.SCHEDULER,
            reason_code=ReasonCode.REPORTED,
            node_id=node_id,
            gpu_ids=(gpu,),
        ),
    )


async def placed_by_us(store: EventStore, task_id: str, node_id: str, gpu: str) -> list[Task]:
    """A placement as the placer commits it (`execute_batch`), returning what it learns."""
    done, _ = await store.execute_batch(
        {
            task_id: lambda t: decide_transition(
                t,
                S.SCHEDULED,
                actor=Actor.SCHEDULER,
                reason_code=ReasonCode.REPORTED,
                node_id=node_id,
                gpu_ids=(gpu,),
            )
        }
    )
    return list(done.values())


async def stop(store: EventStore, task_id: str) -> None:
    """A tenant's stop, then the agent's report that the task stopped: it holds nothing."""
    await store.execute(
        task_id,
        lambda t: decide_transition(
            t, S.STOPPING, actor=Actor.TENANT, reason_code=ReasonCode.REPORTED
        ),
    )
    await store.execute(
        task_id,
        lambda t: decide_transition(
            t, S.STOPPED, actor=Actor.AGENT, reason_code=ReasonCode.REPORTED, report=True
        ),
    )


async def afresh(store: EventStore) -> tuple[list[Node], list[Allocation]]:
    """What the round read before the view existed: every node and holding task parsed."""
    nodes = await view.load_nodes(store)
    holding = await view.load_holding(store)
    snap = view.snapshot(NOW, nodes, holding, {})
    return list(snap.nodes), sorted(snap.allocations, key=lambda a: a.task_id)


async def incremental(
    cluster: view.ClusterView, store: EventStore
) -> tuple[list[Node], list[Allocation]]:
    cluster.invalidate()  # what the scheduler does on the task and node events of each change
    await cluster.refresh(store)
    snap = cluster.snapshot(NOW, {})
    return list(snap.nodes), sorted(snap.allocations, key=lambda a: a.task_id)


async def test_view_matches_a_full_read_as_the_cluster_changes(store: EventStore) -> None:
    cluster = view.ClusterView()
    for node_id in ("n2", "n1"):
        await register(store, node_id)
    whole, fraction, pending = await store.create_tasks(
        [
            (T, TaskSpec(name="w", image="i", gpu_required=1), None, None),
            (T, TaskSpec(name="f", image="i", gpu_memory_mb=8_192), None, None),
            (T, TaskSpec(name="p", image="i", gpu_required=1), None, None),
        ]
    )
    await place(store, whole.id, "n1", "n1-g0")
    await place(store, fraction.id, "n2", "n2-g1")
    assert await incremental(cluster, store) == await afresh(store)
    nodes_before = cluster.nodes

    # A task moves on, another ends, a node loses a card, a new node comes.
    await store.execute(
        whole.id,
        lambda t: decide_transition(
            t, S.STARTING, actor=Actor.AGENT, reason_code=ReasonCode.REPORTED, report=True
        ),
    )
    await store.execute(
        fraction.id,
        lambda t: decide_transition(
            t, S.STOPPING, actor=Actor.TENANT, reason_code=ReasonCode.REPORTED
        ),
    )
    assert await incremental(cluster, store) == await afresh(store)
    assert cluster.nodes is nodes_before  # no node changed: the planner may reuse its index

    await store.execute_aggregate(
        NODES, "n2", lambda _n: [GpuLost(node_id="n2", gpu_id="n2-g0", missed_heartbeats=3)]
    )
    await register(store, "n3")
    await place(store, pending.id, "n3", "n3-g1")
    got = await incremental(cluster, store)
    assert got == await afresh(store)
    assert [n.id for n in got[0]] == ["n1", "n2", "n3"]
    assert cluster.nodes is not nodes_before


def followed(planner: Planner, snap: ClusterSnapshot) -> None:
    """The planner's kept ledger brought to `snap` equals one built from its allocations."""
    ev = Evaluation.of(snap, None, planner)
    kept = planner.ledger(ev)
    assert kept.synced is snap.allocations
    assert state(kept) == state(Ledger(ev.index, snap.allocations, ev.gpus))


async def test_each_snapshot_says_what_changed_since_the_last(store: EventStore) -> None:
    """The view's delta (what the planner's ledger applies instead of scanning every
    allocation) takes the last snapshot's allocations to this one's, through listings,
    learned commits, a node change that re-derives a fraction, and a task that ended."""
    cluster, planner = view.ClusterView(), Planner()
    for node_id in ("n1", "n2"):
        await register(store, node_id)
    whole, fraction, other, late = await store.create_tasks(
        [
            (T, TaskSpec(name="w", image="i", gpu_required=1), None, None),
            (T, TaskSpec(name="f", image="i", gpu_memory_mb=8_192), None, None),
            (T, TaskSpec(name="o", image="i", gpu_required=1), None, None),
            (T, TaskSpec(name="l", image="i", gpu_required=1), None, None),
        ]
    )
    await place(store, whole.id, "n1", "n1-g0")
    await place(store, fraction.id, "n2", "n2-g1")
    await cluster.refresh(store)
    last = cluster.snapshot(NOW, {})
    assert last.delta is None  # nothing to say it from
    followed(planner, last)

    async def changes(listed: bool) -> AllocationDelta:
        nonlocal last
        if listed:
            cluster.invalidate()
        await cluster.refresh(store)
        snap = cluster.snapshot(NOW, {})
        assert snap.delta is not None and snap.delta.since is last.allocations
        by_id = {a.task_id: a for a in last.allocations}
        for task_id in snap.delta.gone:
            by_id.pop(task_id)
        by_id.update((a.task_id, a) for a in snap.delta.changed)
        assert sorted(by_id.values(), key=lambda a: a.task_id) == sorted(
            snap.allocations, key=lambda a: a.task_id
        )
        assert (list(snap.nodes), sorted(snap.allocations, key=lambda a: a.task_id)) == (
            await afresh(store)
        )
        followed(planner, snap)
        last = snap
        return snap.delta

    cluster.learn(await placed_by_us(store, other.id, "n1", "n1-g1"))
    assert [a.task_id for a in (await changes(listed=False)).changed] == [other.id]
    await stop(store, whole.id)
    assert (await changes(listed=True)).gone == (whole.id,)
    await store.execute_aggregate(
        NODES, "n2", lambda _n: [GpuLost(node_id="n2", gpu_id="n2-g0", missed_heartbeats=3)]
    )
    await register(store, "n3")
    await place(store, late.id, "n3", "n3-g0")
    delta = await changes(listed=True)  # the fraction is derived again from the new nodes
    assert {a.task_id for a in delta.changed} == {fraction.id, late.id}
    assert (await changes(listed=False)).changed == ()  # nothing moved


async def test_learned_tasks_are_not_read_back(store: EventStore) -> None:
    cluster = view.ClusterView()
    await register(store, "n1")
    (task,) = await store.create_tasks(
        [(T, TaskSpec(name="w", image="i", gpu_required=1), None, None)]
    )
    await cluster.refresh(store)
    cluster.learn(await placed_by_us(store, task.id, "n1", "n1-g0"))
    assert await incremental(cluster, store) == await afresh(store)


async def test_between_listings_the_view_only_overstates_what_is_held(store: EventStore) -> None:
    """Without an invalidation the view does not list again (a listing costs every holding
    task and node): a task that ended still looks held, a placement of ours is known at once,
    and the listing after `invalidate` (or `relist_s`) is the store's truth."""
    cluster = view.ClusterView(relist_s=3600)
    await register(store, "n1")
    ended, placed = await store.create_tasks(
        [(T, TaskSpec(name=n, image="i", gpu_required=1), None, None) for n in ("e", "p")]
    )
    await place(store, ended.id, "n1", "n1-g0")
    await cluster.refresh(store)
    assert [a.task_id for a in cluster.allocations] == [ended.id]

    await stop(store, ended.id)
    cluster.learn(await placed_by_us(store, placed.id, "n1", "n1-g1"))
    await cluster.refresh(store)  # no listing: the ended task still holds its card here
    assert sorted(a.task_id for a in cluster.allocations) == sorted([ended.id, placed.id])

    cluster.invalidate()
    await cluster.refresh(store)
    assert [a.task_id for a in cluster.allocations] == [placed.id]
    assert (list(cluster.nodes), sorted(cluster.allocations, key=lambda a: a.task_id)) == (
        await afresh(store)
    )

    always = view.ClusterView(relist_s=0)  # relist_s 0: every refresh lists
    await always.refresh(store)
    await stop(store, placed.id)
    await always.refresh(store)
    assert always.allocations == ()


async def test_a_rounds_placement_event_records_why_this_node(store: EventStore) -> None:
    """The placer commits the chosen node's named scores with the placement: the stored
    event says the node was left with no free card (bin-pack), the other with one more."""
    for node_id in ("n1", "n2"):
        await register(store, node_id)
    held, pending = await store.create_tasks(
        [
            (T, TaskSpec(name="h", image="i", gpu_required=1), None, None),
            (T, TaskSpec(name="p", image="i", gpu_required=1, memory_mb=4_096), None, None),
        ]
    )
    await place(store, held.id, "n2", "n2-g0")
    result = await Placer(store, store.clock).round()
    assert result.placements == [pending.id]
    (event,) = [e for e in await store.read_stream(pending.id) if e.version == 2]
    assert event.payload["node_id"] == "n2"
    assert event.payload["scores"] == {
        "free_cards_after": 0,
        "card_room_after": 0.0,
        "free_memory_mb_after": 65_536 - 4_096 - 2_048,
    }


async def test_the_pending_queue_parses_a_task_once_per_version(store: EventStore) -> None:
    """Each round lists the queue, but only a new or moved document is sent and parsed: an
    unchanged task is the model of the round before, a changed one is read again, one that
    left the queue is gone, and the order is the store's (priority, then age)."""
    from libs.domain.task.decide import decide_pending_reason, decide_stop

    low, high, other = await store.create_tasks(
        [
            (T, TaskSpec(name="low", image="i", gpu_required=1, priority=1), None, None),
            (T, TaskSpec(name="high", image="i", gpu_required=1, priority=9), None, None),
            (T, TaskSpec(name="other", image="i", gpu_required=1, priority=5), None, None),
        ]
    )
    queue = view.PendingQueue()
    first = await queue.load(store, 10)
    assert [t.id for t in first] == [high.id, other.id, low.id] and queue.parsed_last == 3
    assert first == await view.load_pending(store, 10), "the same tasks as a full read"

    planned = queue.pendings(first)
    assert planned == [view.pending_of(t) for t in first]
    again = await queue.load(store, 10)
    assert queue.parsed_last == 0
    assert all(a is b for a, b in zip(again, first, strict=True)), "kept, not re-parsed"
    assert all(a is b for a, b in zip(queue.pendings(again), planned, strict=True))
    member = first[0].model_copy(update={"id": "m1", "group_id": "g1", "rank": 1})
    two, three = view.Gang(2), view.Gang(3)
    assert queue.pendings([member], {"g1": two})[0].gang_size == 2
    assert queue.pendings([member], {"g1": three})[0].gang_size == 3, "its gang moved"
    assert queue.pendings([member], {"g1": three}, {"g1": 1})[0].variant_pin == 1

    await store.execute(
        low.id, lambda t: decide_pending_reason(t, ReasonCode.INSUFFICIENT_GPUS, "no free card")
    )
    await store.execute(other.id, lambda t: decide_stop(t, Actor.TENANT))
    moved = await queue.load(store, 10)
    assert [t.id for t in moved] == [high.id, low.id] and queue.parsed_last == 1
    assert moved[0] is first[0]
    assert moved[1].version == low.version + 1 and moved[1].pending_reason == "no free card"
    assert moved == await view.load_pending(store, 10)
    replanned = queue.pendings(moved)
    assert replanned[0] is planned[0] and replanned[1] == view.pending_of(moved[1])
    assert replanned[1] is not planned[2], "the moved task's PendingTask is built again"

    # The limit applies before the cache: a batch of one is the highest task alone.
    assert [t.id for t in await queue.load(store, 1)] == [high.id]
    assert [t.id for t in await queue.load(store, 10)] == [high.id, low.id]
    assert queue.parsed_last == 1, "the task dropped by the short batch is read again"
