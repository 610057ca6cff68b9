"""The indexed search against the plain definition: every node checked with `check_node`.

Random clusters (mixed kinds, offline nodes, lost cards, whole and fractional work, memory and
CPU use, anti-affinity, quotas) and random tasks; the planner must place exactly the tasks that
fit somewhere, on a node that fits and is best on the bin-pack's first key, and explain every
other task with the reason and the per-reason counts that checking every node gives.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from libs.domain.task.states import TaskStatus
from services.scheduler.placement.feasibility import (
    Quota,
    check_quota_floor,
    usage_of,
)
from services.scheduler.placement.index import ClusterIndex
from services.scheduler.placement.ledger import FULL, Ledger, bucket_key
from services.scheduler.placement.model import (
    Allocation,
    ClusterSnapshot,
    Gpu,
    GpuShare,
    Node,
    PendingTask,
    Plan,
    Requirement,
    share_on,
)
from services.scheduler.placement.planner import plan
from services.scheduler.placement.rankers import rank, score
from services.scheduler.placement.reasons import Reason
from services.scheduler.placement.search import seeded_walk
from services.scheduler.placement.stages import (
    NODE_STAGE_ORDER,
    check_node,
)

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
GB = 1024
KINDS = (
    ("nvidia", "A100-80GB", 80 * GB, 4),
    ("nvidia", "L4", 24 * GB, 2),
    ("amd", "MI300X", 192 * GB, 4),
    ("huawei", "Ascend910B", 64 * GB, 2),
    ("", "", 0, 0),  # CPU only
)
TYPES = ("", "", "nvidia", "A100", "amd", "Ascend", "L4", "H100")
STATUSES = (TaskStatus.RUNNING, TaskStatus.SCHEDULED, TaskStatus.PREEMPTING, TaskStatus.COMPLETED)


def random_cluster(rng: random.Random, n: int) -> ClusterSnapshot:
    nodes, allocs = [], []
    for i in range(n):
        vendor, model, vram, count = rng.choice(KINDS)
        node_id = f"n{i:03d}"
        lost = {j for j in range(count) if rng.random() < 0.1}
        gpus = tuple(
            Gpu(f"{node_id}-g{j}", j, vendor, model, vram, excluded=j in lost) for j in range(count)
        )
        node = Node(node_id, rng.random() > 0.1, 64 * GB, 16.0, gpus)
        nodes.append(node)
        allocs += random_allocations(rng, node)
    rng.shuffle(nodes)
    quotas = {"beta": 12.0} if rng.random() < 0.5 else {}
    return ClusterSnapshot(NOW, tuple(nodes), tuple(allocs), quotas)


def random_allocations(rng: random.Random, node: Node) -> list[Allocation]:
    out = []
    for k, gpu in enumerate(node.gpus):
        roll = rng.random()
        tenant = rng.choice(("acme", "beta"))
        alloc = Allocation(
            f"{node.id}-a{k}",
            tenant,
            node.id,
            memory_mb=rng.choice((0, 8 * GB, 30 * GB)),
            cpu_cores=rng.choice((0.0, 4.0, 8.0)),
            status=rng.choice(STATUSES),
            anti_affinity=("web",) if rng.random() < 0.2 else (),
            priority=rng.randrange(3),
            preemptible=rng.random() < 0.5,
            gpu_ids=(gpu.id,),
        )
        if roll < 0.35:
            out.append(alloc)
        elif roll < 0.55:
            share = GpuShare(gpu.id, rng.choice((8 * GB, 20 * GB)), rng.choice((0.25, 0.5)))
            out.append(replace(alloc, fractions=(share,)))
    return out


def random_task(rng: random.Random, i: int, node_ids: list[str]) -> PendingTask:
    kind = rng.random()
    gpus = vram = 0
    ratio = 0.0
    if kind < 0.5:
        gpus = rng.choice((1, 1, 2, 3, 4, 5))
    elif kind < 0.8:
        vram, ratio = rng.choice(((8 * GB, 0.0), (0, 0.5), (30 * GB, 0.25), (100 * GB, 0.0)))
    req = Requirement(
        gpu_count=gpus,
        gpu_type=rng.choice(TYPES),
        gpu_memory_mb=vram,
        gpu_compute_ratio=ratio,
        memory_mb=rng.choice((2 * GB, 16 * GB, 40 * GB)),
        cpu_cores=rng.choice((1.0, 4.0, 12.0)),
        requested_node_id=rng.choice(node_ids) if rng.random() < 0.05 else "",
        anti_affinity=("web",) if rng.random() < 0.2 else (),
    )
    excluded = frozenset(rng.sample(node_ids, 3)) if rng.random() < 0.2 else frozenset()
    min_vram = rng.choice((24 * GB, 64 * GB)) if gpus and rng.random() < 0.15 else 0
    return PendingTask(
        f"t{i:03d}",
        rng.choice(("acme", "beta")),
        req,
        NOW,
        excluded_node_ids=excluded,
        required_min_vram_mb=min_vram,
    )


def brute_force(snapshot: ClusterSnapshot, task: PendingTask) -> tuple[list, list]:  # type: ignore[type-arg]
    """(fits, failures) from checking every node, as the planner did before the index."""
    nodes = sorted(snapshot.nodes, key=lambda n: n.id)
    by_node: dict[str, list[Allocation]] = {}
    for a in snapshot.allocations:
        by_node.setdefault(a.node_id, []).append(a)
    gpus = snapshot.gpus_by_id()
    limit = snapshot.quota_of(task.tenant_id)
    quota = None
    if limit > 0:
        used = sum(
            (sum(share_cost_of(s, gpus) for s in a.fractions) if a.fractions else len(a.gpu_ids))
            for a in snapshot.allocations
            if a.holding and a.tenant_id == task.tenant_id
        )
        quota = Quota(task.tenant_id, limit, used)
    fits, failures = [], []
    for node in nodes:
        verdict, fit = check_node(task, node, usage_of(by_node.get(node.id, [])), quota=quota)
        (fits.append(fit) if fit is not None else failures.append((node, verdict)))
    return fits, failures


def quota_floor_ok(snapshot: ClusterSnapshot, task: PendingTask) -> bool:
    limit = snapshot.quota_of(task.tenant_id)
    if limit <= 0:
        return True
    gpus = snapshot.gpus_by_id()
    used = sum(
        (sum(share_cost_of(s, gpus) for s in a.fractions) if a.fractions else len(a.gpu_ids))
        for a in snapshot.allocations
        if a.holding and a.tenant_id == task.tenant_id
    )
    return check_quota_floor(task, Quota(task.tenant_id, limit, used)).ok


def share_cost_of(share: GpuShare, gpus: dict[str, Gpu]) -> float:
    gpu = gpus.get(share.gpu_id)
    return max(share.compute_ratio, share.vram_mb / gpu.vram_mb if gpu and gpu.vram_mb else 0.0)


def expected_tally(failures: list) -> tuple[Reason, str]:  # type: ignore[type-arg]
    stage = {r: i for i, r in enumerate(NODE_STAGE_ORDER)}
    closest = max((v.reason for _, v in failures), key=lambda r: stage[r])
    counts = Counter(v.reason.value for _, v in failures)
    parts = ", ".join(f"{n} {r}" for r, n in sorted(counts.items(), key=lambda c: (-c[1], c[0])))
    return closest, f"[{len(failures)} nodes checked: {parts}]"


@pytest.mark.parametrize("seed", range(60))
def test_single_task_matches_checking_every_node(seed: int) -> None:
    rng = random.Random(seed)
    snapshot = random_cluster(rng, rng.randrange(5, 40))
    node_ids = [n.id for n in snapshot.nodes]
    for i in range(6):
        task = random_task(rng, i, node_ids)
        fits, failures = brute_force(snapshot, task)
        result = plan(snapshot, [task])
        exhaustive = plan(snapshot, [task], max_candidates=None)
        placed = result.placement_for(task.task_id)
        if fits:
            assert placed is not None, (seed, task)
            chosen = next(f for f in fits if f.node.id == placed.node_id)
            assert score(chosen, task)[0] == min(score(f, task)[0] for f in fits)
            best = rank(fits, task)[0]
            assert exhaustive.placements[0].node_id == best.node.id
            assert exhaustive.placements[0].gpu_ids == best.grant.gpu_ids
            continue
        assert placed is None and exhaustive.placement_for(task.task_id) is None
        unplaced = result.unplaced_for(task.task_id)
        assert unplaced is not None
        if not quota_floor_ok(snapshot, task):
            assert unplaced.reason is Reason.TENANT_QUOTA_EXCEEDED
            continue
        reason, tally = expected_tally(failures)
        assert unplaced.reason is reason, (seed, task, unplaced)
        if len(failures) > 1:
            assert tally in unplaced.message, (seed, task, unplaced.message)


@pytest.mark.parametrize("seed", range(30))
def test_a_batch_never_overcommits(seed: int) -> None:
    rng = random.Random(1000 + seed)
    snapshot = random_cluster(rng, rng.randrange(5, 30))
    node_ids = [n.id for n in snapshot.nodes]
    pending = [replace(random_task(rng, i, node_ids), priority=0) for i in range(40)]
    result = plan(snapshot, pending, max_batch=len(pending))
    replay_plan(snapshot, pending, result)


def replay_plan(snapshot: ClusterSnapshot, pending: list[PendingTask], result: Plan) -> None:
    """Apply the placements one by one, each checked in full against what came before."""
    by_id = {t.task_id: t for t in pending}
    allocs = list(snapshot.allocations)
    for p in result.placements:
        task = by_id[p.task_id]
        current = replace(snapshot, allocations=tuple(allocs))
        fits, _ = brute_force(current, task)
        assert p.node_id in {f.node.id for f in fits}, p
        node = next(n for n in snapshot.nodes if n.id == p.node_id)
        on_node = [a for a in allocs if a.node_id == node.id]
        _, fit = check_node(task, node, usage_of(on_node), quota=None)
        assert fit is not None
        shares = tuple(share_on(task.requirement, g) for g in node.gpus if g.id in p.gpu_ids)
        req = task.requirement
        allocs.append(
            Allocation(
                task.task_id,
                task.tenant_id,
                node.id,
                TaskStatus.SCHEDULED,
                gpu_ids=p.gpu_ids,
                fractions=shares if req.is_fractional else (),
                memory_mb=req.memory_mb,
                cpu_cores=req.cpu_cores,
                anti_affinity=req.anti_affinity,
            )
        )


# --- the pieces ----------------------------------------------------------------------


def mk_node(node_id: str, gpus: int = 4, online: bool = True, lost: tuple[int, ...] = ()) -> Node:
    cards = tuple(
        Gpu(f"{node_id}-g{i}", i, "nvidia", "A100-80GB", 80 * GB, excluded=i in lost)
        for i in range(gpus)
    )
    return Node(node_id, online, 256 * GB, 64, cards)


def test_classes_group_same_cards_and_state() -> None:
    index = ClusterIndex(
        [mk_node("b"), mk_node("a"), mk_node("c", online=False), mk_node("d", lost=(1,))]
    )
    assert [n.id for n in index.nodes] == ["a", "b", "c", "d"]
    assert [c.positions for c in index.classes] == [(0, 1), (2,), (3,)]
    assert index.healthy == [4, 4, 4, 3]


BUCKET_CASES = [
    ([], 4, "idle"),
    ([Allocation("x", "t", "n", TaskStatus.RUNNING, gpu_ids=("n-g0",))], 3, "one-busy"),
    (
        [Allocation("x", "t", "n", TaskStatus.RUNNING, gpu_ids=tuple(f"n-g{i}" for i in range(4)))],
        FULL,
        "all-busy",
    ),
    (
        [
            Allocation("x", "t", "n", TaskStatus.RUNNING, gpu_ids=("n-g0", "n-g1", "n-g2")),
            Allocation(
                "y",
                "t",
                "n",
                TaskStatus.RUNNING,
                gpu_ids=("n-g3",),
                fractions=(GpuShare("n-g3", 8 * GB, 0.25),),
            ),
        ],
        0,
        "shared-card-with-room",
    ),
    (
        [
            Allocation("x", "t", "n", TaskStatus.RUNNING, gpu_ids=("n-g0", "n-g1", "n-g2")),
            Allocation(
                "y",
                "t",
                "n",
                TaskStatus.RUNNING,
                gpu_ids=("n-g3",),
                fractions=(GpuShare("n-g3", 8 * GB, 1.0),),
            ),
        ],
        FULL,
        "shared-card-full",
    ),
]


@pytest.mark.parametrize(
    ("allocs", "key"), [c[:2] for c in BUCKET_CASES], ids=[c[2] for c in BUCKET_CASES]
)
def test_bucket_key(allocs: list[Allocation], key: int) -> None:
    assert bucket_key(mk_node("n"), usage_of(allocs)) == key


def test_rollback_restores_buckets_usage_and_quota() -> None:
    index = ClusterIndex([mk_node("a"), mk_node("b")])
    ledger = Ledger(index, [], {})
    before = (ledger.key_of[:], [dict(b) for b in ledger.buckets], dict(ledger.tenant_used))
    mark = ledger.checkpoint()
    version = ledger.version
    ledger.reserve(Allocation("x", "t", "a", TaskStatus.SCHEDULED, gpu_ids=("a-g0",)), 1.0)
    assert ledger.key_of[0] == 3 and ledger.tenant_used == {"t": 1.0}
    ledger.rollback(mark)
    assert (ledger.key_of, ledger.buckets, ledger.tenant_used) == (
        before[0],
        before[1],
        {"t": 0.0},
    )
    assert ledger.version not in (version, 0)


def test_seeded_walk_visits_everything_once_and_replays() -> None:
    lists = [[1, 4, 7], [2], [3, 5, 6, 8, 9]]
    first = list(seeded_walk(lists, random.Random("task-1")))
    assert sorted(first) == list(range(1, 10))
    assert list(seeded_walk(lists, random.Random("task-1"))) == first
    starts = {next(seeded_walk(lists, random.Random(f"task-{i}"))) for i in range(30)}
    assert len(starts) > 2


def test_same_shape_reuses_the_answer_and_names_each_task() -> None:
    busy = [Allocation("b", "acme", "a", TaskStatus.RUNNING, gpu_ids=("a-g0", "a-g1"))]
    snapshot = ClusterSnapshot(NOW, (mk_node("a", gpus=2), mk_node("b", online=False)), tuple(busy))
    pending = [PendingTask(f"t{i}", "acme", Requirement(gpu_count=1), NOW) for i in range(3)]
    result = plan(snapshot, pending)
    assert [u.task_id for u in result.unplaced] == ["t0", "t1", "t2"]
    assert len({u.text for u in result.unplaced}) == 1
    assert result.unplaced[0].reason is Reason.INSUFFICIENT_GPUS


def test_max_candidates_must_be_positive() -> None:
    with pytest.raises(ValueError):
        plan(ClusterSnapshot(NOW), [], max_candidates=0)
