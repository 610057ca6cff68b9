"""The planner: ordering, batch reservation, reasons, quota, preemption, gangs, replay."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from libs.domain.task.model import Task, TaskId, TaskSpec, TenantId
from libs.domain.task.states import TaskStatus
from services.scheduler.placement.model import (
    Allocation,
    ClusterSnapshot,
    Gpu,
    GpuShare,
    Node,
    PendingTask,
    Plan,
    Qos,
    QueueLimits,
    Requirement,
)
from services.scheduler.placement.planner import plan
from services.scheduler.placement.reasons import PLACEMENT_REASONS, Reason

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
GB = 1024
S = TaskStatus


def mk_node(
    node_id: str,
    gpus: int = 4,
    *,
    vendor: str = "nvidia",
    model: str = "A100-80GB",
    vram: int = 80 * GB,
    mig: bool = False,
    online: bool = True,
    memory: int = 256 * GB,
    cpu: float = 64,
    lost: tuple[int, ...] = (),
) -> Node:
    cards = tuple(
        Gpu(
            f"{node_id}-gpu{i}",
            i,
            vendor,
            model,
            vram,
            mig_capable=mig,
            mig_enabled=mig,
            excluded=i in lost,
        )
        for i in range(gpus)
    )
    return Node(node_id, online, memory, cpu, cards)


def mk_task(
    task_id: str,
    tenant: str = "acme",
    *,
    gpus: int = 0,
    gpu_type: str = "",
    vram: int = 0,
    ratio: float = 0.0,
    memory: int = 2048,
    pin: str = "",
    anti: tuple[str, ...] = (),
    priority: int = 0,
    age_s: int = 0,
    **extra: Any,
) -> PendingTask:
    req = Requirement(gpus, gpu_type, vram, ratio, memory, 1.0, pin, anti)
    created = NOW - timedelta(seconds=age_s)
    return PendingTask(task_id, tenant, req, created_at=created, priority=priority, **extra)


def mk_alloc(
    task_id: str,
    node: str,
    cards: Sequence[int] = (),
    *,
    tenant: str = "acme",
    status: TaskStatus = S.RUNNING,
    priority: int = 0,
    preemptible: bool = False,
    fraction: tuple[int, float] | None = None,
    memory: int = 0,
    anti: tuple[str, ...] = (),
) -> Allocation:
    gpu_ids = tuple(f"{node}-gpu{i}" for i in cards)
    shares = (GpuShare(gpu_ids[0], *fraction),) if fraction else ()
    return Allocation(
        task_id,
        tenant,
        node,
        status,
        gpu_ids=gpu_ids,
        fractions=shares,
        memory_mb=memory,
        priority=priority,
        preemptible=preemptible,
        anti_affinity=anti,
    )


def snap(
    *nodes: Node,
    allocs: Sequence[Allocation] = (),
    quotas: dict[str, float] | None = None,
) -> ClusterSnapshot:
    return ClusterSnapshot(NOW, tuple(nodes), tuple(allocs), quotas or {})


def why(result: Plan, task_id: str) -> str:
    unplaced = result.unplaced_for(task_id)
    assert unplaced is not None, f"{task_id} was placed"
    return unplaced.message


def only_reason(result: Plan, task_id: str) -> Reason:
    unplaced = result.unplaced_for(task_id)
    assert unplaced is not None, f"{task_id} was placed"
    assert result.placement_for(task_id) is None
    return unplaced.reason


# --- every reason through the planner ------------------------------------------------

BUSY = [mk_alloc("busy", "n1", range(4))]

REASON_CASES: list[tuple[ClusterSnapshot, list[PendingTask], Reason, str]] = [
    (snap(), [mk_task("t", gpus=1)], Reason.NO_NODES, "no-nodes"),
    (snap(mk_node("n1", online=False)), [mk_task("t", gpus=1)], Reason.NODE_OFFLINE, "offline"),
    (snap(mk_node("n1")), [mk_task("t", gpus=1, pin="n9")], Reason.PINNED_ELSEWHERE, "pin"),
    (
        snap(mk_node("n1")),
        [mk_task("t", gpus=1, excluded_node_ids=frozenset({"n1"}))],
        Reason.NODE_EXCLUDED,
        "excluded",
    ),
    (
        snap(replace(mk_node("n1"), runtime="docker")),
        [replace(t := mk_task("t"), requirement=replace(t.requirement, runtime="process"))],
        Reason.RUNTIME_UNAVAILABLE,
        "no-image-on-docker",
    ),
    (
        snap(mk_node("n1"), mk_node("n2", vendor="amd", model="MI300X")),
        [mk_task("t", gpus=1, gpu_type="H100")],
        Reason.GPU_TYPE_UNAVAILABLE,
        "gpu-type",
    ),
    (
        snap(mk_node("n1")),
        [mk_task("t", gpus=1, required_min_vram_mb=80 * GB)],
        Reason.INSUFFICIENT_VRAM,
        "vram",
    ),
    (snap(mk_node("n1"), allocs=BUSY), [mk_task("t", gpus=1)], Reason.INSUFFICIENT_GPUS, "gpus"),
    (
        snap(mk_node("n1"), allocs=BUSY),
        [mk_task("t", ratio=0.1)],
        Reason.FRACTION_UNAVAILABLE,
        "fraction",
    ),
    (
        snap(mk_node("n1"), allocs=[mk_alloc("big", "n1", memory=255 * GB)]),
        [mk_task("t", gpus=1, memory=2 * GB)],
        Reason.INSUFFICIENT_MEMORY,
        "memory",
    ),
    (
        snap(mk_node("n1", cpu=0.5)),
        [mk_task("t", gpus=1)],
        Reason.INSUFFICIENT_CPU,
        "cpu",
    ),
    (
        snap(mk_node("n1"), allocs=[mk_alloc("a", "n1", (0,), anti=("k",))]),
        [mk_task("t", gpus=1, anti=("k",))],
        Reason.ANTI_AFFINITY,
        "anti-affinity",
    ),
    (
        snap(
            replace(mk_node("n1"), max_starting=1), allocs=[mk_alloc("a", "n1", status=S.STARTING)]
        ),
        [mk_task("t", gpus=1)],
        Reason.STARTS_IN_FLIGHT,
        "starts-in-flight",
    ),
    (
        snap(mk_node("n1"), quotas={"acme": 1}),
        [mk_task("t", gpus=2)],
        Reason.TENANT_QUOTA_EXCEEDED,
        "quota",
    ),
    (
        snap(mk_node("n1")),
        [mk_task("t", gpus=1, not_before=NOW + timedelta(minutes=1))],
        Reason.BACKOFF,
        "backoff",
    ),
    (
        snap(mk_node("n1")),
        [mk_task("t", gpus=1, gang_id="g", gang_size=2)],
        Reason.GANG_INCOMPLETE,
        "gang",
    ),
    (
        replace(snap(mk_node("n1")), queues={"q": QueueLimits("q", max_gpus=1)}),
        [mk_task("t", gpus=2, queue="q")],
        Reason.QUEUE_QUOTA_EXCEEDED,
        "queue-quota",
    ),
    (
        replace(
            snap(mk_node("n1"), mk_node("n2")), queues={"q": QueueLimits("q", frozenset({"p"}))}
        ),
        [mk_task("t", gpus=1, queue="q")],
        Reason.NOT_IN_POOL,
        "not-in-pool",
    ),
    (
        replace(
            snap(replace(mk_node("n1"), pools=frozenset({"p"})), mk_node("n2"), allocs=BUSY),
            queues={"q": QueueLimits("q", frozenset({"p"}))},
        ),
        [mk_task("t", gpus=1, queue="q")],
        Reason.POOL_CAPACITY,
        "pool-full",
    ),
    (
        snap(mk_node("n1"), allocs=[replace(mk_alloc("busy", "n1"), ports=(29500,))]),
        [mk_task("t", master_port=29500)],
        Reason.PORT_TAKEN,
        "port-taken",
    ),
    (
        snap(
            replace(mk_node("n1"), host_id="h1", address="127.0.0.1"),
            replace(mk_node("n2"), host_id="h2", address="127.0.0.1"),
        ),
        [
            mk_task(m, anti=("spread",), gang_id="g", gang_size=2, host_network=True)
            for m in ("t", "u")
        ],
        Reason.LOOPBACK_ADDRESS,
        "loopback",
    ),
]


@pytest.mark.parametrize(
    ("snapshot", "pending", "reason"),
    [c[:3] for c in REASON_CASES],
    ids=[c[3] for c in REASON_CASES],
)
def test_unplaced_reason(
    snapshot: ClusterSnapshot, pending: list[PendingTask], reason: Reason
) -> None:
    result = plan(snapshot, pending)
    assert only_reason(result, "t") is reason
    assert why(result, "t")
    assert not result.preemptions


def test_every_reason_is_exercised() -> None:
    assert {c[2] for c in REASON_CASES} == set(PLACEMENT_REASONS)


def test_gpu_type_message_names_the_type() -> None:
    result = plan(
        snap(mk_node("n1"), mk_node("n2", online=False)), [mk_task("t", gpus=1, gpu_type="H100")]
    )
    unplaced = result.unplaced_for("t")
    assert unplaced is not None
    assert unplaced.message.startswith("no online node has GPU type 'H100'")


def test_closest_node_reason_wins() -> None:
    # n1 offline, n2 has the type but is busy: the busy node got further, so that is the answer.
    nodes = (mk_node("n1", online=False), mk_node("n2"))
    result = plan(snap(*nodes, allocs=[mk_alloc("a", "n2", range(4))]), [mk_task("t", gpus=1)])
    unplaced = result.unplaced_for("t")
    assert unplaced is not None and unplaced.reason is Reason.INSUFFICIENT_GPUS
    assert "2 nodes checked" in unplaced.message and "node_offline" in unplaced.message


def test_pinned_to_offline_node_says_offline() -> None:
    nodes = (mk_node("n1", online=False), mk_node("n2"))
    result = plan(snap(*nodes), [mk_task("t", gpus=1, pin="n1")])
    assert only_reason(result, "t") is Reason.NODE_OFFLINE


def test_pin_to_unknown_node_is_named() -> None:
    result = plan(snap(mk_node("n1")), [mk_task("t", gpus=1, pin="ghost")])
    unplaced = result.unplaced_for("t")
    assert unplaced is not None and "'ghost'" in unplaced.message


# --- placement: whole, fractions, QoS, constraints -----------------------------------

QOS_CASES = [
    ("nvidia", "A100-80GB", True, Qos.GOLD, "nvidia-mig"),
    ("nvidia", "RTX4090", False, Qos.SILVER, "nvidia-no-mig"),
    ("amd", "MI300X", False, Qos.BRONZE, "amd"),
    ("huawei", "Ascend910B", False, Qos.BRONZE, "huawei"),
    ("intel", "Max1550", False, Qos.BRONZE, "intel"),
]


@pytest.mark.parametrize(
    ("vendor", "model", "mig", "qos"), [c[:4] for c in QOS_CASES], ids=[c[4] for c in QOS_CASES]
)
def test_fraction_qos_derived_on_placement(vendor: str, model: str, mig: bool, qos: Qos) -> None:
    node = mk_node("n1", vendor=vendor, model=model, mig=mig, vram=64 * GB)
    result = plan(snap(node), [mk_task("t", vram=16 * GB)])
    placed = result.placement_for("t")
    assert placed is not None
    assert placed.qos is qos
    assert placed.fractions == (GpuShare("n1-gpu0", 16 * GB, 0.25),)
    assert placed.gpu_ids == ("n1-gpu0",)


def test_whole_cards_have_no_qos_and_skip_lost_cards() -> None:
    result = plan(snap(mk_node("n1", lost=(0, 1))), [mk_task("t", gpus=2)])
    placed = result.placement_for("t")
    assert placed is not None
    assert placed.qos is None and placed.fractions == ()
    assert placed.gpu_ids == ("n1-gpu2", "n1-gpu3")


TYPE_CASES = [
    ("nvidia", {"n-a100", "n-4090"}, "vendor-any-of-its-cards"),
    ("amd", {"n-mi300"}, "amd-vendor"),
    ("A100", {"n-a100"}, "model-substring"),
    ("a100-80gb", {"n-a100"}, "model-case-insensitive"),
    ("nvidia/RTX4090", {"n-4090"}, "vendor-slash-model"),
    ("Ascend", {"n-910b"}, "ascend"),
]


@pytest.mark.parametrize(
    ("gpu_type", "node_ids"), [c[:2] for c in TYPE_CASES], ids=[c[2] for c in TYPE_CASES]
)
def test_gpu_type_selects_node(gpu_type: str, node_ids: set[str]) -> None:
    nodes = (
        mk_node("n-a100"),
        mk_node("n-4090", model="RTX4090", vram=24 * GB),
        mk_node("n-mi300", vendor="amd", model="MI300X", vram=192 * GB),
        mk_node("n-910b", vendor="huawei", model="Ascend910B", vram=64 * GB),
    )
    pending = [mk_task(f"t{i}", gpus=1, gpu_type=gpu_type, age_s=9 - i) for i in range(8)]
    result = plan(snap(*nodes), pending)
    assert {p.node_id for p in result.placements} == node_ids


def test_fractions_share_one_card_and_never_overcommit() -> None:
    pending = [mk_task(f"f{i}", ratio=0.4, age_s=10 - i) for i in range(3)]
    result = plan(snap(mk_node("n1", gpus=1)), pending)
    assert [p.task_id for p in result.placements] == ["f0", "f1"]
    assert only_reason(result, "f2") is Reason.FRACTION_UNAVAILABLE


def test_fraction_packs_onto_shared_card() -> None:
    allocs = [mk_alloc("a", "n1", (2,), fraction=(8 * GB, 0.5))]
    placed = plan(snap(mk_node("n1"), allocs=allocs), [mk_task("t", ratio=0.25)]).placement_for("t")
    assert placed is not None and placed.gpu_ids == ("n1-gpu2",)


CONSTRAINT_CASES = [
    (mk_task("t", gpus=1, same_node_id="n2"), "n2", "same-node"),
    (mk_task("t", gpus=1, pin="n3"), "n3", "pin"),
    (mk_task("t", gpus=1, required_min_vram_mb=40 * GB), "n3", "min-vram-strictly-more"),
    (mk_task("t", gpus=1, excluded_node_ids=frozenset({"n1", "n2"})), "n3", "avoid-nodes"),
]


@pytest.mark.parametrize(
    ("task", "node_id"), [c[:2] for c in CONSTRAINT_CASES], ids=[c[2] for c in CONSTRAINT_CASES]
)
def test_retry_constraints(task: PendingTask, node_id: str) -> None:
    nodes = (
        mk_node("n1", model="A100-40GB", vram=40 * GB),
        mk_node("n2", model="A100-40GB", vram=40 * GB),
        mk_node("n3"),
    )
    # n1 is busiest, so bin-packing would pick it without the constraint.
    allocs = [mk_alloc("a", "n1", (0, 1, 2))]
    placed = plan(snap(*nodes, allocs=allocs), [task]).placement_for("t")
    assert placed is not None and placed.node_id == node_id


def test_bin_pack_prefers_most_allocated_node() -> None:
    allocs = [mk_alloc("a", "n2", (0, 1))]
    placed = plan(snap(mk_node("n1"), mk_node("n2"), allocs=allocs), [mk_task("t", gpus=1)])
    assert [p.node_id for p in placed.placements] == ["n2"]


def test_anti_affinity_spreads_one_batch() -> None:
    pending = [mk_task(f"r{i}", gpus=1, anti=("svc",), age_s=5 - i) for i in range(3)]
    result = plan(snap(mk_node("n1"), mk_node("n2")), pending)
    assert sorted(p.node_id for p in result.placements) == ["n1", "n2"]
    assert only_reason(result, "r2") is Reason.ANTI_AFFINITY


# --- order and batch reservation -----------------------------------------------------


def test_priority_first_then_fifo() -> None:
    pending = [
        mk_task("low-old", gpus=1, priority=1, age_s=100),
        mk_task("high-new", gpus=1, priority=50, age_s=1),
        mk_task("mid-new", gpus=1, priority=10, age_s=1),
        mk_task("mid-old", gpus=1, priority=10, age_s=50),
    ]
    result = plan(snap(mk_node("n1", gpus=2)), pending)
    assert [p.task_id for p in result.placements] == ["high-new", "mid-old"]
    assert [u.task_id for u in result.unplaced] == ["mid-new", "low-old"]


def test_two_tasks_for_the_last_card_place_one() -> None:
    allocs = [mk_alloc("a", "n1", (0, 1, 2))]
    pending = [mk_task("first", gpus=1, age_s=2), mk_task("second", gpus=1, age_s=1)]
    result = plan(snap(mk_node("n1"), allocs=allocs), pending)
    assert [p.task_id for p in result.placements] == ["first"]
    assert only_reason(result, "second") is Reason.INSUFFICIENT_GPUS


def test_max_batch_defers_the_rest_and_backoff_does_not_use_it() -> None:
    pending = [
        mk_task("waiting", gpus=1, priority=90, not_before=NOW + timedelta(seconds=5)),
        mk_task("a", gpus=1, age_s=3),
        mk_task("b", gpus=1, age_s=2),
        mk_task("c", gpus=1, age_s=1),
    ]
    result = plan(snap(mk_node("n1")), pending, max_batch=2)
    assert [p.task_id for p in result.placements] == ["a", "b"]
    assert result.deferred == ("c",)
    assert only_reason(result, "waiting") is Reason.BACKOFF


def test_backoff_over_is_placed() -> None:
    task = mk_task("t", gpus=1, not_before=NOW - timedelta(seconds=1))
    assert plan(snap(mk_node("n1")), [task]).placement_for("t") is not None


def test_max_batch_must_be_positive() -> None:
    with pytest.raises(ValueError):
        plan(snap(), [], max_batch=0)


# --- quota ---------------------------------------------------------------------------

QUOTA_CASES = [
    (S.RUNNING, False, "running-counts"),
    (S.SLEEPING, False, "sleeping-counts"),
    (S.STOPPING, False, "stopping-counts"),
    (S.PREEMPTING, False, "preempting-counts"),
    (S.COMPLETED, True, "completed-does-not"),
    (S.FAILED, True, "failed-does-not"),
]


@pytest.mark.parametrize(
    ("status", "placed"), [c[:2] for c in QUOTA_CASES], ids=[c[2] for c in QUOTA_CASES]
)
def test_quota_counts_gpu_holding(status: TaskStatus, placed: bool) -> None:
    allocs = [mk_alloc("old", "n1", (0, 1), status=status)]
    result = plan(snap(mk_node("n1"), allocs=allocs, quotas={"acme": 2}), [mk_task("t", gpus=1)])
    assert (result.placement_for("t") is not None) is placed
    if not placed:
        assert only_reason(result, "t") is Reason.TENANT_QUOTA_EXCEEDED


def test_quota_counts_this_rounds_placements_and_other_tenants_are_free() -> None:
    pending = [
        mk_task("a1", gpus=1, age_s=3),
        mk_task("a2", gpus=1, age_s=2),
        mk_task("b1", "beta", gpus=2, age_s=1),
    ]
    result = plan(snap(mk_node("n1"), quotas={"acme": 1, "beta": 0}), pending)
    assert sorted(p.task_id for p in result.placements) == ["a1", "b1"]
    assert only_reason(result, "a2") is Reason.TENANT_QUOTA_EXCEEDED


def test_quota_counts_fractions_by_share() -> None:
    pending = [mk_task(f"f{i}", ratio=0.25, age_s=9 - i) for i in range(5)]
    result = plan(snap(mk_node("n1"), quotas={"acme": 1}), pending)
    assert len(result.placements) == 4
    assert only_reason(result, "f4") is Reason.TENANT_QUOTA_EXCEEDED


# --- preemption ----------------------------------------------------------------------

PREEMPT_CASES = [
    (5, True, 10, True, "preemptible-lower-priority"),
    (5, False, 10, False, "not-preemptible"),
    (10, True, 10, False, "equal-priority"),
    (20, True, 10, False, "higher-priority"),
]


@pytest.mark.parametrize(
    ("victim_prio", "preemptible", "prio", "preempts"),
    [c[:4] for c in PREEMPT_CASES],
    ids=[c[4] for c in PREEMPT_CASES],
)
def test_preemption_rules(victim_prio: int, preemptible: bool, prio: int, preempts: bool) -> None:
    allocs = [
        mk_alloc("v", "n1", range(4), priority=victim_prio, preemptible=preemptible),
    ]
    result = plan(snap(mk_node("n1"), allocs=allocs), [mk_task("t", gpus=2, priority=prio)])
    assert result.placement_for("t") is None
    assert only_reason(result, "t") is Reason.INSUFFICIENT_GPUS
    if preempts:
        assert [(p.task_id, p.node_id, p.victims) for p in result.preemptions] == [
            ("t", "n1", ("v",))
        ]
        assert "preempting 1" in why(result, "t")
    else:
        assert result.preemptions == ()


def test_preemption_picks_fewest_and_lowest_victims() -> None:
    allocs = [
        # n1: two small victims needed.
        mk_alloc("n1-a", "n1", (0, 1), priority=1, preemptible=True),
        mk_alloc("n1-b", "n1", (2, 3), priority=1, preemptible=True),
        # n2: one victim suffices but a higher priority one than n3's.
        mk_alloc("n2-a", "n2", range(4), priority=8, preemptible=True),
        # n3: one low-priority victim; the other task is not preemptible.
        mk_alloc("n3-a", "n3", range(3), priority=2, preemptible=True),
        mk_alloc("n3-keep", "n3", (3,), priority=0),
    ]
    nodes = (mk_node("n1"), mk_node("n2"), mk_node("n3"))
    result = plan(snap(*nodes, allocs=allocs), [mk_task("t", gpus=3, priority=50)])
    assert [(p.node_id, p.victims) for p in result.preemptions] == [("n3", ("n3-a",))]


def test_preemption_takes_only_what_is_needed() -> None:
    allocs = [mk_alloc(f"v{i}", "n1", (i,), priority=i, preemptible=True) for i in range(4)]
    result = plan(snap(mk_node("n1"), allocs=allocs), [mk_task("t", gpus=2, priority=50)])
    assert [p.victims for p in result.preemptions] == [("v0", "v1")]


def test_no_second_preemption_while_capacity_is_leaving() -> None:
    allocs = [
        mk_alloc("going", "n1", range(4), priority=1, preemptible=True, status=S.PREEMPTING),
        mk_alloc("other", "n2", range(4), priority=1, preemptible=True),
    ]
    nodes = (mk_node("n1"), mk_node("n2"))
    result = plan(snap(*nodes, allocs=allocs), [mk_task("t", gpus=4, priority=50)])
    assert result.preemptions == ()
    unplaced = result.unplaced_for("t")
    assert unplaced is not None and "waiting for capacity" in unplaced.message


def test_two_preemptors_in_one_round_take_different_victims() -> None:
    allocs = [
        mk_alloc("v1", "n1", range(4), priority=1, preemptible=True),
        mk_alloc("v2", "n2", range(4), priority=1, preemptible=True),
    ]
    pending = [
        mk_task("p1", gpus=4, priority=50, age_s=2),
        mk_task("p2", gpus=4, priority=50, age_s=1),
    ]
    result = plan(snap(mk_node("n1"), mk_node("n2"), allocs=allocs), pending)
    victims = sorted(v for p in result.preemptions for v in p.victims)
    assert victims == ["v1", "v2"]
    assert result.placements == ()


def test_lower_priority_task_cannot_take_capacity_held_for_preemptor() -> None:
    allocs = [mk_alloc("v", "n1", range(2), priority=1, preemptible=True)]
    pending = [mk_task("big", gpus=4, priority=50, age_s=2), mk_task("small", gpus=2, priority=5)]
    result = plan(snap(mk_node("n1"), allocs=allocs), pending)
    assert [p.victims for p in result.preemptions] == [("v",)]
    assert only_reason(result, "small") is Reason.INSUFFICIENT_GPUS


# --- gangs ---------------------------------------------------------------------------


def test_gang_placed_together() -> None:
    gang = [mk_task(f"g{i}", gpus=4, gang_id="job", gang_size=2, age_s=5 - i) for i in range(2)]
    result = plan(snap(mk_node("n1"), mk_node("n2")), gang)
    assert sorted(p.node_id for p in result.placements) == ["n1", "n2"]


def test_gang_all_or_nothing_frees_its_reservation() -> None:
    gang = [mk_task(f"g{i}", gpus=4, gang_id="job", age_s=10 - i) for i in range(3)]
    later = mk_task("later", gpus=4, age_s=1)
    result = plan(snap(mk_node("n1"), mk_node("n2")), [*gang, later])
    placed = {p.task_id for p in result.placements}
    assert not placed & {"g0", "g1", "g2"}
    assert only_reason(result, "g2") is Reason.INSUFFICIENT_GPUS
    assert only_reason(result, "g0") is Reason.GANG_INCOMPLETE
    assert "'g2'" in why(result, "g0")
    # What the gang tried to hold went back: a later task gets a node.
    assert "later" in placed


def test_gang_with_member_in_backoff_waits_whole() -> None:
    gang = [
        mk_task("g0", gpus=1, gang_id="job"),
        mk_task("g1", gpus=1, gang_id="job", not_before=NOW + timedelta(seconds=9)),
    ]
    result = plan(snap(mk_node("n1")), gang)
    assert result.placements == ()
    assert only_reason(result, "g1") is Reason.BACKOFF
    assert only_reason(result, "g0") is Reason.GANG_INCOMPLETE


def test_gang_never_preempts() -> None:
    allocs = [mk_alloc("v", "n1", range(4), priority=1, preemptible=True)]
    gang = [mk_task("g0", gpus=4, priority=50, gang_id="job")]
    result = plan(snap(mk_node("n1"), allocs=allocs), gang)
    assert result.preemptions == ()


# --- replay --------------------------------------------------------------------------


def test_tie_break_is_seeded_by_task_id_and_replayable() -> None:
    nodes = [mk_node(f"n{i}") for i in range(8)]
    pending = [mk_task(f"t{i}", gpus=4, age_s=20 - i) for i in range(8)]
    first = plan(snap(*nodes), pending)
    again = plan(snap(*reversed(nodes)), list(reversed(pending)))
    assert first == again
    assert len({p.node_id for p in first.placements}) == 8


def test_tie_break_differs_between_task_ids() -> None:
    nodes = [mk_node(f"n{i}") for i in range(8)]
    chosen = {
        plan(snap(*nodes), [mk_task(f"task-{i}", gpus=1)]).placements[0].node_id for i in range(20)
    }
    assert len(chosen) > 1


# --- from the domain -----------------------------------------------------------------


def test_from_task_round_trip() -> None:
    spec = TaskSpec(name="x", image="img", gpu_memory_mb=20 * GB, priority=30, preemptible=True)
    task = Task(
        id=TaskId("t1"),
        tenant_id=TenantId("acme"),
        spec=spec,
        status=S.RUNNING,
        node_id="n1",
        gpu_ids=("n1-gpu0",),
        created_at=NOW,
        updated_at=NOW,
    )
    node = mk_node("n1")
    alloc = Allocation.from_task(task, {g.id: g for g in node.gpus})
    assert alloc.fractions == (GpuShare("n1-gpu0", 20 * GB, 0.25),)
    assert alloc.preemptible and alloc.priority == 30
    pending = PendingTask.from_task(task, excluded_node_ids=frozenset({"n2"}))
    assert pending.priority == 30 and pending.requirement.gpu_memory_mb == 20 * GB
    result = plan(
        snap(node, allocs=[alloc]), [PendingTask.from_task(task.model_copy(update={"id": "t2"}))]
    )
    placed = result.placement_for("t2")
    assert placed is not None and placed.gpu_ids == ("n1-gpu0",)


def test_why_pending_text_carries_reason_and_message() -> None:
    result = plan(snap(mk_node("n1")), [mk_task("t", gpus=1, gpu_type="H100")])
    unplaced = result.unplaced_for("t")
    assert unplaced is not None
    assert unplaced.text == "gpu_type_unavailable: no online node has GPU type 'H100'"
