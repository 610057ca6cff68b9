"""Feasibility stages, GPU type matching, QoS derivation and usage accounting."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from libs.domain.task.model import TaskSpec
from libs.domain.task.states import TaskStatus
from services.scheduler.placement.feasibility import (
    Quota,
    allocation_cost,
    check_backoff,
    check_quota_floor,
    usage_of,
)
from services.scheduler.placement.model import (
    Allocation,
    Gpu,
    GpuShare,
    Node,
    PendingTask,
    Qos,
    Requirement,
    derive_qos,
    gpu_matches,
    share_on,
)
from services.scheduler.placement.reasons import Reason
from services.scheduler.placement.stages import (
    NODE_STAGE_ORDER,
    check_node,
)

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
GB = 1024


def mk_node(
    node_id: str = "n1",
    gpus: int = 4,
    *,
    vendor: str = "nvidia",
    model: str = "A100-80GB",
    vram: int = 80 * GB,
    mig: bool = False,
    lost: tuple[int, ...] = (),
    online: bool = True,
    memory: int = 256 * GB,
    cpu: float = 64,
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
    task_id: str = "t1",
    tenant: str = "acme",
    *,
    gpus: int = 0,
    gpu_type: str = "",
    vram: int = 0,
    ratio: float = 0.0,
    memory: int = 2048,
    cpu: float = 1.0,
    pin: str = "",
    anti: tuple[str, ...] = (),
    **extra: Any,
) -> PendingTask:
    req = Requirement(gpus, gpu_type, vram, ratio, memory, cpu, pin, anti)
    return PendingTask(task_id, tenant, req, created_at=NOW, **extra)


def process_only(task: PendingTask) -> PendingTask:
    """The task as a create without `image` makes it: runnable on process nodes only."""
    return replace(task, requirement=replace(task.requirement, runtime="process"))


def mk_alloc(
    task_id: str,
    gpu_ids: tuple[str, ...] = (),
    *,
    node: str = "n1",
    tenant: str = "acme",
    status: TaskStatus = TaskStatus.RUNNING,
    fractions: tuple[GpuShare, ...] = (),
    memory: int = 0,
    cpu: float = 0.0,
    anti: tuple[str, ...] = (),
) -> Allocation:
    return Allocation(
        task_id,
        tenant,
        node,
        status,
        gpu_ids=gpu_ids,
        fractions=fractions,
        memory_mb=memory,
        cpu_cores=cpu,
        anti_affinity=anti,
    )


def share(gpu_id: str, vram: int, ratio: float) -> GpuShare:
    return GpuShare(gpu_id, vram, ratio)


# --- GPU type ------------------------------------------------------------------------

MATCH_CASES = [
    ("nvidia", "A100-80GB", "", True, "empty-matches-any"),
    ("nvidia", "A100-80GB", "A100", True, "model-substring"),
    ("nvidia", "A100-80GB", "a100", True, "case-insensitive"),
    ("nvidia", "A100-80GB", " A100 ", True, "whitespace-trimmed"),
    ("nvidia", "A100-80GB", "NVIDIA", True, "vendor-name"),
    ("nvidia", "RTX4090", "nvidia", True, "vendor-name-other-model"),
    ("amd", "MI300X", "nvidia", False, "other-vendor"),
    ("amd", "MI300X", "AMD", True, "amd-vendor"),
    ("nvidia", "A100-80GB", "nvidia/a100", True, "vendor-slash-model"),
    ("amd", "MI300X", "nvidia/MI300", False, "vendor-slash-wrong-vendor"),
    ("amd", "MI300X", "amd/", True, "vendor-slash-empty-model"),
    ("amd", "MI300X", "MI300", True, "prefix-before-letter"),
    ("nvidia", "A100-80GB", "A10", False, "does-not-cut-a-number"),
    ("nvidia", "RTX4090", "4090", True, "number-after-letters"),
    ("nvidia", "RTX4090", "090", False, "does-not-start-inside-a-number"),
    ("nvidia", "A100-80GB", "80GB", True, "memory-suffix"),
    ("huawei", "Ascend910B", "ascend", True, "ascend-model"),
    ("huawei", "Ascend910B", "huawei", True, "huawei-vendor"),
    ("nvidia", "A100-80GB", "H100", False, "other-model"),
]


@pytest.mark.parametrize(
    ("vendor", "model", "wanted", "expected"),
    [c[:4] for c in MATCH_CASES],
    ids=[c[4] for c in MATCH_CASES],
)
def test_gpu_matches(vendor: str, model: str, wanted: str, expected: bool) -> None:
    assert gpu_matches(Gpu("g", 0, vendor, model, 80 * GB), wanted) is expected


# --- QoS -----------------------------------------------------------------------------

QOS_CASES = [
    ("nvidia", (True, True), Qos.GOLD, "nvidia-mig-enabled-gold"),
    ("nvidia", (True, False), Qos.SILVER, "nvidia-mig-capable-not-enabled-silver"),
    ("nvidia", False, Qos.SILVER, "nvidia-mps-silver"),
    ("NVIDIA", False, Qos.SILVER, "vendor-case-insensitive"),
    ("amd", False, Qos.BRONZE, "amd-bronze"),
    ("huawei", True, Qos.BRONZE, "mig-flag-ignored-off-nvidia"),
    ("intel", False, Qos.BRONZE, "intel-bronze"),
]


@pytest.mark.parametrize(
    ("vendor", "mig", "expected"), [c[:3] for c in QOS_CASES], ids=[c[3] for c in QOS_CASES]
)
def test_derive_qos(vendor: str, mig: bool | tuple[bool, bool], expected: Qos) -> None:
    capable, enabled = mig if isinstance(mig, tuple) else (mig, mig)
    gpu = Gpu("g", 0, vendor, "X", 16 * GB, mig_capable=capable, mig_enabled=enabled)
    assert derive_qos(gpu) is expected


# --- fractions and usage -------------------------------------------------------------

SHARE_CASES = [
    (40 * GB, 0.0, 40 * GB, 0.5, "vram-only-derives-compute"),
    (0, 0.25, 20 * GB, 0.25, "compute-only-derives-vram"),
    (8 * GB, 0.5, 8 * GB, 0.5, "both-given-kept"),
]


@pytest.mark.parametrize(
    ("vram", "ratio", "want_vram", "want_ratio"),
    [c[:4] for c in SHARE_CASES],
    ids=[c[4] for c in SHARE_CASES],
)
def test_share_on_accounts_both_dimensions(
    vram: int, ratio: float, want_vram: int, want_ratio: float
) -> None:
    s = share_on(Requirement(gpu_memory_mb=vram, gpu_compute_ratio=ratio), mk_node().gpus[0])
    assert s.vram_mb == want_vram
    assert s.compute_ratio == pytest.approx(want_ratio)


USAGE_CASES = [
    (TaskStatus.RUNNING, True, "running-counts"),
    (TaskStatus.SLEEPING, True, "sleeping-counts"),
    (TaskStatus.STOPPING, True, "stopping-counts"),
    (TaskStatus.PREEMPTING, True, "preempting-counts"),
    (TaskStatus.COMPLETED, False, "completed-does-not"),
    (TaskStatus.PENDING, False, "pending-does-not"),
    (TaskStatus.FAILED, False, "failed-does-not"),
]


@pytest.mark.parametrize(
    ("status", "counts"), [c[:2] for c in USAGE_CASES], ids=[c[2] for c in USAGE_CASES]
)
def test_usage_counts_gpu_holding_only(status: TaskStatus, counts: bool) -> None:
    usage = usage_of([mk_alloc("a", ("n1-gpu0",), status=status, memory=1000, cpu=2)])
    assert ("n1-gpu0" in usage.cards) is counts
    assert usage.memory_mb == (1000 if counts else 0)


def test_usage_sums_fractions_per_card() -> None:
    usage = usage_of(
        [
            mk_alloc("a", ("n1-gpu0",), fractions=(share("n1-gpu0", 10 * GB, 0.25),)),
            mk_alloc("b", ("n1-gpu0",), fractions=(share("n1-gpu0", 20 * GB, 0.5),)),
        ]
    )
    card = usage.cards["n1-gpu0"]
    assert (card.whole, card.vram_mb, card.compute_ratio) == (False, 30 * GB, 0.75)


COST_CASES = [
    (mk_alloc("a", ("n1-gpu0", "n1-gpu1")), 2.0, "whole-cards-count-one-each"),
    (
        mk_alloc("b", ("n1-gpu0",), fractions=(share("n1-gpu0", 20 * GB, 0.5),)),
        0.5,
        "fraction-by-compute",
    ),
    (
        mk_alloc("c", ("n1-gpu0",), fractions=(share("n1-gpu0", 60 * GB, 0.25),)),
        0.75,
        "fraction-by-vram-when-larger",
    ),
]


@pytest.mark.parametrize(
    ("alloc", "cost"), [c[:2] for c in COST_CASES], ids=[c[2] for c in COST_CASES]
)
def test_allocation_cost(alloc: Allocation, cost: float) -> None:
    gpus = {g.id: g for g in mk_node().gpus}
    assert allocation_cost(alloc, gpus) == pytest.approx(cost)


# --- node stages ---------------------------------------------------------------------

G0, G1, G2, G3 = (f"n1-gpu{i}" for i in range(4))
FULL = (G0, G1, G2, G3)

# (task, node, allocations, quota, expected reason or None for a fit, expected cards)
NODE_CASES: list[tuple[PendingTask, Node, list[Allocation], Quota | None, Reason | None, str]] = [
    (mk_task(gpus=1), mk_node(), [], None, None, "fits-whole"),
    (mk_task(), mk_node(gpus=0), [], None, None, "cpu-only-on-cpu-node"),
    (mk_task(gpus=1, pin="n2"), mk_node(), [], None, Reason.PINNED_ELSEWHERE, "pinned-elsewhere"),
    (mk_task(gpus=1, pin="n1"), mk_node(), [], None, None, "pinned-here"),
    (
        mk_task(gpus=1, same_node_id="n2"),
        mk_node(),
        [],
        None,
        Reason.PINNED_ELSEWHERE,
        "same-node-retry-elsewhere",
    ),
    (mk_task(gpus=1), mk_node(online=False), [], None, Reason.NODE_OFFLINE, "offline"),
    (
        mk_task(gpus=1, excluded_node_ids=frozenset({"n1"})),
        mk_node(),
        [],
        None,
        Reason.NODE_EXCLUDED,
        "excluded-node",
    ),
    (
        replace(mk_task(gpus=1), pools=frozenset({"a100"})),
        replace(mk_node(), pools=frozenset({"h100"})),
        [],
        None,
        Reason.NOT_IN_POOL,
        "node-outside-the-queue-pools",
    ),
    (
        replace(mk_task(gpus=1), pools=frozenset({"a100", "h100"})),
        replace(mk_node(), pools=frozenset({"h100", "shared"})),
        [],
        None,
        None,
        "node-in-one-of-the-pools",
    ),
    (
        process_only(mk_task()),
        replace(mk_node(gpus=0), runtime="docker"),
        [],
        None,
        Reason.RUNTIME_UNAVAILABLE,
        "no-image-on-docker-node",
    ),
    (
        process_only(mk_task()),
        replace(mk_node(gpus=0), runtime="process"),
        [],
        None,
        None,
        "no-image-on-process-node",
    ),
    (mk_task(), replace(mk_node(gpus=0), runtime="docker"), [], None, None, "image-on-docker"),
    (
        mk_task(gpus=1, gpu_type="H100"),
        mk_node(),
        [],
        None,
        Reason.GPU_TYPE_UNAVAILABLE,
        "wrong-type",
    ),
    (
        mk_task(gpus=1, required_min_vram_mb=80 * GB),
        mk_node(),
        [],
        None,
        Reason.INSUFFICIENT_VRAM,
        "min-vram-must-be-exceeded",
    ),
    (
        mk_task(gpus=1, required_min_vram_mb=24 * GB),
        mk_node(),
        [],
        None,
        None,
        "min-vram-exceeded",
    ),
    (
        mk_task(vram=96 * GB),
        mk_node(),
        [],
        None,
        Reason.INSUFFICIENT_VRAM,
        "fraction-larger-than-card",
    ),
    (
        mk_task(gpus=2),
        mk_node(),
        [mk_alloc("a", (G0, G1, G2))],
        None,
        Reason.INSUFFICIENT_GPUS,
        "gpus-busy",
    ),
    (mk_task(gpus=5), mk_node(), [], None, Reason.INSUFFICIENT_GPUS, "node-too-small"),
    (
        mk_task(gpus=4),
        mk_node(lost=(3,)),
        [],
        None,
        Reason.INSUFFICIENT_GPUS,
        "lost-card-excluded",
    ),
    (
        mk_task(gpus=1),
        mk_node(),
        [mk_alloc("a", FULL, status=TaskStatus.COMPLETED)],
        None,
        None,
        "completed-frees-cards",
    ),
    (
        mk_task(gpus=1),
        mk_node(),
        [mk_alloc("a", FULL, status=TaskStatus.SLEEPING)],
        None,
        Reason.INSUFFICIENT_GPUS,
        "sleeping-holds-cards",
    ),
    (
        mk_task(gpus=1),
        mk_node(gpus=2),
        [mk_alloc("a", (G0,), fractions=(share(G0, GB, 0.1),))],
        None,
        None,
        "shared-card-not-whole-free",
    ),
    (
        mk_task(gpus=2),
        mk_node(gpus=2),
        [mk_alloc("a", (G0,), fractions=(share(G0, GB, 0.1),))],
        None,
        Reason.INSUFFICIENT_GPUS,
        "shared-card-blocks-whole",
    ),
    (
        mk_task(ratio=0.5),
        mk_node(gpus=1),
        [mk_alloc("a", (G0,))],
        None,
        Reason.FRACTION_UNAVAILABLE,
        "whole-held-card-blocks-fraction",
    ),
    (
        mk_task(vram=40 * GB),
        mk_node(gpus=1),
        [mk_alloc("a", (G0,), fractions=(share(G0, 50 * GB, 0.1),))],
        None,
        Reason.FRACTION_UNAVAILABLE,
        "fraction-vram-sum",
    ),
    (
        mk_task(vram=GB, ratio=0.5),
        mk_node(gpus=1),
        [mk_alloc("a", (G0,), fractions=(share(G0, GB, 0.6),))],
        None,
        Reason.FRACTION_UNAVAILABLE,
        "fraction-compute-sum",
    ),
    (
        mk_task(ratio=0.3),
        mk_node(gpus=1),
        [
            mk_alloc(x, (G0,), fractions=(share(G0, 8 * GB, r),))
            for x, r in (("a", 0.3), ("b", 0.4))
        ],
        None,
        None,
        "fractions-fill-card-exactly",
    ),
    (
        mk_task(memory=300 * GB),
        mk_node(),
        [],
        None,
        Reason.INSUFFICIENT_MEMORY,
        "memory",
    ),
    (
        mk_task(gpus=1, memory=100 * GB),
        mk_node(),
        [mk_alloc("a", memory=200 * GB)],
        None,
        Reason.INSUFFICIENT_MEMORY,
        "memory-used",
    ),
    (mk_task(cpu=65), mk_node(), [], None, Reason.INSUFFICIENT_CPU, "cpu"),
    (
        mk_task(gpus=1, anti=("web",)),
        mk_node(),
        [mk_alloc("a", (G0,), anti=("web",))],
        None,
        Reason.ANTI_AFFINITY,
        "anti-affinity",
    ),
    (
        mk_task(gpus=1, anti=("web",)),
        mk_node(),
        [mk_alloc("a", (G0,), anti=("web",), status=TaskStatus.COMPLETED)],
        None,
        None,
        "anti-affinity-ignores-completed",
    ),
    (
        mk_task(gpus=1, anti=("web",)),
        mk_node(),
        [mk_alloc("a", (G0,), anti=("web",), tenant="other")],
        None,
        None,
        "anti-affinity-scoped-to-tenant",
    ),
    (
        mk_task(),
        replace(mk_node(), max_starting=2),
        [mk_alloc("a", status=TaskStatus.SCHEDULED), mk_alloc("b", status=TaskStatus.STARTING)],
        None,
        Reason.STARTS_IN_FLIGHT,
        "starts-in-flight",
    ),
    (
        mk_task(),
        replace(mk_node(), max_starting=2),
        [mk_alloc("a", status=TaskStatus.SCHEDULED), mk_alloc("b")],
        None,
        None,
        "starts-in-flight-running-frees-one",
    ),
    (
        mk_task(gpus=2),
        mk_node(),
        [],
        Quota("acme", 3, 2),
        Reason.TENANT_QUOTA_EXCEEDED,
        "quota-exact",
    ),
    (mk_task(gpus=1), mk_node(), [], Quota("acme", 3, 2), None, "quota-just-fits"),
    (
        mk_task(vram=60 * GB),
        mk_node(),
        [],
        Quota("acme", 1, 0.5),
        Reason.TENANT_QUOTA_EXCEEDED,
        "quota-fraction-by-vram-share",
    ),
]


@pytest.mark.parametrize(
    ("task", "node", "allocs", "quota", "expected"),
    [c[:5] for c in NODE_CASES],
    ids=[c[5] for c in NODE_CASES],
)
def test_check_node(
    task: PendingTask,
    node: Node,
    allocs: list[Allocation],
    quota: Quota | None,
    expected: Reason | None,
) -> None:
    verdict, fit = check_node(task, node, usage_of(allocs), quota=quota)
    assert verdict.reason is expected
    assert verdict.ok is (expected is None)
    assert (fit is not None) is (expected is None)
    if expected is not None:
        assert verdict.message


def test_every_node_reason_has_a_case() -> None:
    covered = {c[4] for c in NODE_CASES}
    assert set(NODE_STAGE_ORDER) <= covered


def test_whole_cards_skip_lost_and_pick_smallest_sufficient() -> None:
    node = Node(
        "n1",
        True,
        256 * GB,
        64,
        (
            Gpu("big", 0, "nvidia", "A100-80GB", 80 * GB),
            Gpu("lost", 1, "nvidia", "RTX4090", 24 * GB, excluded=True),
            Gpu("small", 2, "nvidia", "RTX4090", 24 * GB),
        ),
    )
    _, fit = check_node(mk_task(gpus=1), node, usage_of([]), quota=None)
    assert fit is not None and fit.grant.gpu_ids == ("small",)
    _, fit = check_node(
        mk_task(gpus=1, required_min_vram_mb=24 * GB), node, usage_of([]), quota=None
    )
    assert fit is not None and fit.grant.gpu_ids == ("big",)


def test_fraction_goes_to_fullest_card_with_qos() -> None:
    node = mk_node(gpus=3, mig=True)
    allocs = [mk_alloc("a", (G1,), fractions=(share(G1, 40 * GB, 0.5),))]
    _, fit = check_node(mk_task(ratio=0.25), node, usage_of(allocs), quota=None)
    assert fit is not None
    assert fit.grant.gpu_ids == (G1,)
    assert fit.grant.qos is Qos.GOLD
    assert fit.grant.fractions == (GpuShare(G1, 20 * GB, 0.25),)


def test_gpu_type_message_names_the_type() -> None:
    verdict, _ = check_node(mk_task(gpus=1, gpu_type="H100"), mk_node(), usage_of([]), quota=None)
    assert "'H100'" in verdict.message


# --- task-level checks ---------------------------------------------------------------

BACKOFF_CASES = [
    (None, True, "no-backoff"),
    (NOW + timedelta(seconds=30), False, "in-backoff"),
    (NOW, True, "backoff-ends-now"),
    (NOW - timedelta(seconds=1), True, "backoff-over"),
]


@pytest.mark.parametrize(
    ("not_before", "ok"), [c[:2] for c in BACKOFF_CASES], ids=[c[2] for c in BACKOFF_CASES]
)
def test_check_backoff(not_before: datetime | None, ok: bool) -> None:
    verdict = check_backoff(mk_task(not_before=not_before), NOW)
    assert verdict.ok is ok
    assert verdict.reason is (None if ok else Reason.BACKOFF)


QUOTA_FLOOR_CASES = [
    (mk_task(gpus=2), None, True, "unlimited"),
    (mk_task(gpus=2), Quota("acme", 4, 2), True, "fits"),
    (mk_task(gpus=3), Quota("acme", 4, 2), False, "whole-over"),
    (mk_task(ratio=0.6), Quota("acme", 1, 0.5), False, "fraction-over"),
    (mk_task(), Quota("acme", 1, 1), True, "cpu-only-never-blocked"),
]


@pytest.mark.parametrize(
    ("task", "quota", "ok"),
    [c[:3] for c in QUOTA_FLOOR_CASES],
    ids=[c[3] for c in QUOTA_FLOOR_CASES],
)
def test_check_quota_floor(task: PendingTask, quota: Quota | None, ok: bool) -> None:
    verdict = check_quota_floor(task, quota)
    assert verdict.ok is ok
    if not ok:
        assert verdict.reason is Reason.TENANT_QUOTA_EXCEEDED
        assert "quota" in verdict.message


# --- building from the domain --------------------------------------------------------

SPEC_CASES = [
    ({"gpu_required": 2, "gpu_type": " A100 "}, Requirement(gpu_count=2, gpu_type="A100")),
    ({"gpu_memory_mb": 8192}, Requirement(gpu_memory_mb=8192)),
    (
        {"gpu_compute_ratio": 0.5, "memory_mb": 4096, "cpu_cores": 2},
        Requirement(gpu_compute_ratio=0.5, memory_mb=4096, cpu_cores=2),
    ),
    (
        {"requested_node_id": "n7", "anti_affinity": "web"},
        Requirement(requested_node_id="n7", anti_affinity=("web",)),
    ),
]


@pytest.mark.parametrize(
    ("fields", "expected"), SPEC_CASES, ids=["whole", "fraction-vram", "fraction-ratio", "pin"]
)
def test_requirement_from_spec(fields: dict[str, Any], expected: Requirement) -> None:
    spec = TaskSpec(name="x", image="img", **fields)
    assert Requirement.from_spec(spec) == expected


def test_requirement_kinds() -> None:
    assert Requirement(gpu_count=1).needs_gpu and not Requirement(gpu_count=1).is_fractional
    assert Requirement(gpu_memory_mb=1).is_fractional
    assert not Requirement().needs_gpu
    assert replace(Requirement(), gpu_compute_ratio=0.1).needs_gpu
