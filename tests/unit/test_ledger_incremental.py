"""The planner's kept ledger: `Ledger.update` gives the ledger a rebuild would.

Random sequences of snapshots (tasks coming, going, changing status, queue or tenant; the
snapshot's order shuffled each time; reservations and preemption marks left over from an
evaluation) are applied to one ledger and compared, field by field, with a ledger built from
the same allocations. A planner kept across those snapshots plans what a fresh one does.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from libs.domain.task.states import TaskStatus
from services.scheduler.placement.feasibility import NodeUsage
from services.scheduler.placement.index import ClusterIndex
from services.scheduler.placement.ledger import Ledger
from services.scheduler.placement.model import (
    Allocation,
    AllocationDelta,
    ClusterSnapshot,
    GpuShare,
)
from services.scheduler.placement.planner import Planner, plan
from services.scheduler.placement.queues import QueueUse
from tests.unit.test_scheduler_index import GB, STATUSES, random_cluster, random_task

QUEUES = ("", "", "q1", "q2")
TENANTS = ("acme", "beta", "gamma")


def state(ledger: Ledger) -> dict[str, object]:
    """What the planner reads. A tenant or queue holding nothing reads as one not listed (a
    reservation rolled back may leave such an entry)."""
    return {
        "by_node": {n: held for n, held in ledger.by_node.items() if held},
        "usage": {n: u for n, u in ledger.usage.items() if u != NodeUsage()},
        "key_of": ledger.key_of,
        "evictable": ledger.evictable,
        "buckets": ledger.buckets,
        "tenant_used": {t: v for t, v in ledger.tenant_used.items() if v},
        "queue_use": {q: u for q, u in ledger.queue_use.items() if u != QueueUse()},
    }


def new_allocation(rng: random.Random, snap: ClusterSnapshot, n: int) -> Allocation:
    node = rng.choice(snap.nodes)
    gpus = tuple(g.id for g in rng.sample(node.gpus, rng.randint(0, len(node.gpus))))
    alloc = Allocation(
        f"new{n:04d}",
        rng.choice(TENANTS),
        node.id,
        rng.choice(STATUSES),
        gpu_ids=gpus,
        memory_mb=rng.choice((0, 4 * GB)),
        cpu_cores=rng.choice((0.0, 2.0)),
        preemptible=rng.random() < 0.3,
        anti_affinity=("web",) if rng.random() < 0.2 else (),
        queue=rng.choice(QUEUES),
        job=rng.choice(("", "j1", "j2")),
    )
    if gpus and rng.random() < 0.4:
        shares = tuple(
            GpuShare(g, rng.choice((1 * GB, 6 * GB)), rng.choice((0.1, 0.3))) for g in gpus
        )
        alloc = replace(alloc, fractions=shares)
    return alloc


def step(rng: random.Random, snap: ClusterSnapshot, held: dict[str, Allocation], n: int) -> int:
    """Move the allocations on: some go, some change, a few come."""
    for task_id, a in list(held.items()):
        roll = rng.random()
        if roll < 0.1:
            del held[task_id]
        elif roll < 0.2:
            held[task_id] = replace(a, status=rng.choice(STATUSES))
        elif roll < 0.25:
            held[task_id] = replace(a, queue=rng.choice(QUEUES), tenant_id=rng.choice(TENANTS))
        elif roll < 0.28:
            held[task_id] = replace(a)  # equal, not the same object
    for _ in range(rng.randint(0, 8)):
        a = new_allocation(rng, snap, n)
        held[a.task_id] = a
        n += 1
    return n


def mess_up(rng: random.Random, ledger: Ledger, snap: ClusterSnapshot, n: int) -> None:
    """What an evaluation leaves in the ledger: reservations, preemption marks, rollbacks."""
    for k in range(rng.randint(0, 6)):
        mark = ledger.checkpoint()
        a = replace(new_allocation(rng, snap, n * 100 + k), status=TaskStatus.SCHEDULED)
        ledger.reserve(a, float(len(a.gpu_ids)))
        if rng.random() < 0.3:
            ledger.rollback(mark)
    node = rng.choice(snap.nodes)
    on = ledger.on(node.id)
    if on and rng.random() < 0.5:
        ledger.mark_leaving(node.id, frozenset({on[0].task_id}))


def delta_of(
    old: dict[str, Allocation],
    new: dict[str, Allocation],
    since: tuple[Allocation, ...] | None = None,
) -> AllocationDelta:
    """What a cluster view says changed from `old` (whose snapshot's tuple was `since`) to
    `new`: each allocation that is new or another object, each task gone."""
    changed = tuple(a for t, a in new.items() if old.get(t) is not a)
    gone = tuple(t for t in old if t not in new)
    return AllocationDelta(since or tuple(old.values()), tuple(new.values()), changed, gone)


@pytest.mark.parametrize("seed", range(25))
@pytest.mark.parametrize("how", ["update", "apply"])
def test_a_kept_ledger_equals_rebuilt(how: str, seed: int) -> None:
    """Brought to each snapshot by a scan of its allocations (`update`) or by what changed
    (`apply`, a cluster view's delta); statuses include ones that hold nothing (completed)."""
    rng = random.Random((7000 if how == "update" else 7500) + seed)
    snap = random_cluster(rng, rng.randrange(3, 25))
    index = ClusterIndex(snap.nodes)
    gpus = snap.gpus_by_id()
    held = {a.task_id: a for a in snap.allocations}
    kept = Ledger(index, snap.allocations, gpus)
    n = 0
    for i in range(30):
        mess_up(rng, kept, snap, i)
        before = dict(held)
        n = step(rng, snap, held, n)
        allocations = list(held.values())
        if how == "update":
            rng.shuffle(allocations)
            assert kept.update(allocations), (seed, i)
        else:
            delta = delta_of(before, held)
            assert kept.apply(delta.changed, delta.gone), (seed, i)
        assert state(kept) == state(Ledger(index, allocations, gpus)), (seed, i)


def test_apply_declines_two_allocations_of_one_task() -> None:
    rng = random.Random(3)
    snap = random_cluster(rng, 6)
    kept = Ledger(ClusterIndex(snap.nodes), snap.allocations, snap.gpus_by_id())
    a = replace(new_allocation(rng, snap, 0), status=TaskStatus.RUNNING)
    assert not kept.apply((a, replace(a, node_id=snap.nodes[0].id)), ())
    assert not kept.apply((a,), (a.task_id,))


@pytest.mark.parametrize("seed", range(10))
def test_a_planner_follows_deltas_and_ignores_one_that_does_not_apply(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"apply": 0, "update": 0}
    for name in calls:
        original = getattr(Ledger, name)

        def counted(self: Ledger, *args: object, _name: str = name, _f: object = original) -> bool:
            calls[_name] += 1
            return _f(self, *args)  # type: ignore[operator, no-any-return]

        monkeypatch.setattr(Ledger, name, counted)
    rng = random.Random(9500 + seed)
    snap = random_cluster(rng, rng.randrange(5, 30))
    node_ids = [n.id for n in snap.nodes]
    planner = Planner()
    held = {a.task_id: a for a in snap.allocations}
    last: ClusterSnapshot | None = None
    n = 0
    for i in range(12):
        current = replace(snap, allocations=tuple(held.values()))
        if last is not None:
            old = {a.task_id: a for a in last.allocations}
            delta = delta_of(old, held, since=last.allocations)
            current = replace(current, allocations=delta.allocations, delta=delta)
            if i % 4 == 3:
                # A copy with other allocations keeps a delta that no longer applies.
                current = replace(current, allocations=tuple(reversed(current.allocations)))
        pending = [random_task(rng, i * 100 + k, node_ids) for k in range(rng.randint(1, 25))]
        assert planner.plan(current, pending) == plan(current, pending), (seed, i)
        last = current
        n = step(rng, snap, held, n)
    # Rounds 1-11 carry a delta; those of rounds 3, 7 and 11 do not apply (their
    # allocations were copied) and are scanned instead.
    assert calls == {"apply": 8, "update": 3}


def test_update_declines_a_change_to_lending() -> None:
    rng = random.Random(1)
    snap = random_cluster(rng, 6)
    index = ClusterIndex(snap.nodes)
    node = next(n for n in snap.nodes if n.gpus)
    gpu = node.gpus[0].id
    lender = Allocation("lender", "acme", node.id, TaskStatus.SLEEPING, gpu_ids=(gpu,))
    borrower = Allocation(
        "borrower", "acme", node.id, TaskStatus.RUNNING, gpu_ids=(gpu,), borrowed_from="lender"
    )
    base = (*snap.allocations, lender)
    kept = Ledger(index, base, snap.gpus_by_id())
    assert kept.update(base)  # nothing moved
    assert not kept.update((*base, borrower))  # the borrower's cost depends on its lender
    both = Ledger(index, (*base, borrower), snap.gpus_by_id())
    assert both.tenant_used["acme"] == Ledger(index, base, snap.gpus_by_id()).tenant_used["acme"]


def test_update_declines_two_allocations_of_one_task() -> None:
    rng = random.Random(2)
    snap = random_cluster(rng, 6)
    index = ClusterIndex(snap.nodes)
    kept = Ledger(index, snap.allocations, snap.gpus_by_id())
    a = new_allocation(rng, snap, 0)
    a = replace(a, status=TaskStatus.RUNNING)
    assert not kept.update((*snap.allocations, a, replace(a, node_id=snap.nodes[0].id)))


@pytest.mark.parametrize("seed", range(15))
def test_a_kept_planner_plans_as_a_fresh_one(seed: int) -> None:
    rng = random.Random(9000 + seed)
    snap = random_cluster(rng, rng.randrange(5, 30))
    node_ids = [n.id for n in snap.nodes]
    planner = Planner()
    held = {a.task_id: a for a in snap.allocations}
    n = 0
    for i in range(12):
        allocations = list(held.values())
        rng.shuffle(allocations)
        current = replace(snap, allocations=tuple(allocations))
        pending = [random_task(rng, i * 100 + k, node_ids) for k in range(rng.randint(1, 25))]
        assert planner.plan(current, pending) == plan(current, pending), (seed, i)
        n = step(rng, snap, held, n)
