"""Task variants (docs/scheduling.md#variants): which variants are considered when, the planner
placing the first one that fits, the refusals it names, gangs on one variant, quotas of what
was placed, a GPU OOM retry moving on, and the spec a variant runs."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest

from libs.domain.catalog import parse_payload
from libs.domain.envelope import EventEnvelope
from libs.domain.errors import Code, DomainError
from libs.domain.group.model import parse_group
from libs.domain.job.spec import parse_job
from libs.domain.pool.model import Queue, QueueQuota, QueueSpec
from libs.domain.task.events import TaskRetryDecided, TaskStatusChanged
from libs.domain.task.lending import lendable
from libs.domain.task.model import Task, TaskId, TenantId, parse_create
from libs.domain.task.states import TaskStatus
from libs.domain.task.variants import placed_spec, variant_spec
from services.api_gateway.queueing import check_fits
from services.event_timeline.rules import entries_for
from services.retry_engine.decide import Evidence, NodeFacts, RetryConfig, decide_retry
from services.scheduler.placement.model import (
    Allocation,
    ClusterSnapshot,
    Gpu,
    Node,
    PendingTask,
)
from services.scheduler.placement.planner import plan
from services.scheduler.placement.reasons import Reason
from services.scheduler.placement.variants import open_variants

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
GB = 1024

# The fleet of the issue: an NVIDIA A100 80 GB, an Ascend 910B 64 GB, then CPU (llama.cpp).
VARIANTS: list[dict[str, Any]] = [
    {"gpu_type": "nvidia/A100", "gpu_required": 1, "image": "vllm/vllm-openai:v0.6", "wait_s": 1},
    {
        "gpu_type": "huawei/Ascend910B",
        "gpu_required": 1,
        "image": "ascendai/vllm-ascend:v0.6",
        "env": {"ASCEND_RT_VISIBLE_DEVICES": "0"},
        "wait_s": 2,
    },
    {"image": "ghcr.io/ggml-org/llama.cpp:server", "command": "llama-server -m /m.gguf"},
]


def mk_node(node_id: str, vendor: str = "", model: str = "", vram: int = 0, gpus: int = 1) -> Node:
    cards = tuple(
        Gpu(f"{node_id}-gpu{i}", i, vendor, model, vram * GB) for i in range(gpus if vendor else 0)
    )
    return Node(node_id, True, 256 * GB, 64, cards)


A100 = mk_node("a100", "nvidia", "A100-80GB", 80)
ASCEND = mk_node("ascend", "huawei", "Ascend910B", 64)
CPU = mk_node("cpu")
RTX = mk_node("rtx", "nvidia", "RTX4090", 24)


def mk_task(
    task_id: str = "t1",
    variants: list[dict[str, Any]] | None = None,
    *,
    age_s: float = 0,
    **state: Any,
) -> Task:
    body = {"name": task_id, "image": "busybox:latest", "variants": variants or VARIANTS}
    spec = parse_create(body, tenant=True)
    at = NOW - timedelta(seconds=age_s)
    return Task(
        id=TaskId(task_id),
        tenant_id=TenantId("acme"),
        spec=spec,
        created_at=at,
        updated_at=at,
        **state,
    )


def busy(node: Node, task_id: str = "other") -> Allocation:
    """Every card of `node` held by another tenant's task."""
    return Allocation(
        task_id=f"{task_id}-{node.id}",
        tenant_id="other",
        node_id=node.id,
        status=TaskStatus.RUNNING,
        gpu_ids=tuple(g.id for g in node.gpus),
        memory_mb=1024,
        cpu_cores=1,
    )


def snapshot(*nodes: Node, held: tuple[Allocation, ...] = (), **kw: Any) -> ClusterSnapshot:
    return ClusterSnapshot(now=NOW, nodes=nodes, allocations=held, **kw)


@pytest.mark.parametrize(
    ("age_s", "floor", "considered", "next_index"),
    [
        (0, -1, [0], 1),
        (0.5, -1, [0], 1),
        (1.0, -1, [0, 1], 2),  # variant 0's wait ran out at exactly 1 s
        (1.5, -1, [0, 1], 2),
        (2.0, -1, [0, 1, 2], None),
        (3600, -1, [0, 1, 2], None),  # the last one is waited for for ever
        (0, 0, [0, 1], 2),  # a GPU OOM retry of variant 0 moves on at once
        (0, 1, [0, 1, 2], None),
    ],
    ids=["submitted", "half-wait", "wait-ends", "second", "all", "late", "oom-0", "oom-1"],
)
def test_open_variants(
    age_s: float, floor: int, considered: list[int], next_index: int | None
) -> None:
    pending = PendingTask.from_task(mk_task(age_s=age_s))
    pending = PendingTask(**{**_fields(pending), "variant_floor": floor})
    opening = open_variants(pending, NOW)
    assert [v.index for v in opening.considered] == considered
    assert (opening.next_variant.index if opening.next_variant else None) == next_index
    if next_index is not None:
        wait = VARIANTS[next_index - 1]["wait_s"]
        assert opening.opens_at == pending.created_at + timedelta(seconds=wait)


def _fields(p: PendingTask) -> dict[str, Any]:
    return {f: getattr(p, f) for f in PendingTask.__dataclass_fields__}


def test_no_variants_nothing_to_open() -> None:
    spec = parse_create({"name": "t", "image": "busybox", "gpu_required": 1}, tenant=True)
    task = Task(id=TaskId("t"), tenant_id=TenantId("a"), spec=spec, created_at=NOW, updated_at=NOW)
    pending = PendingTask.from_task(task)
    assert pending.variants == () and open_variants(pending, NOW).considered == ()
    assert pending.requirement.gpu_count == 1


@pytest.mark.parametrize(
    ("age_s", "held", "node", "variant"),
    [
        (0, (), "a100", 0),  # the A100 is free: variant 0
        (5, (), "a100", 0),  # still preferred after its wait ran out
        (1.2, ("a100",), "ascend", 1),  # A100 busy, its wait over: the Ascend
        (2.5, ("a100", "ascend"), "", 2),  # both busy: CPU only, on any node
    ],
    ids=["a100-free", "a100-late", "ascend", "cpu"],
)
def test_first_feasible_variant_placed(
    age_s: float, held: tuple[str, ...], node: str, variant: int
) -> None:
    nodes = {n.id: n for n in (A100, ASCEND, CPU)}
    snap = snapshot(A100, ASCEND, CPU, held=tuple(busy(nodes[h]) for h in held))
    p = plan(snap, [PendingTask.from_task(mk_task(age_s=age_s))])
    (placed,) = p.placements
    assert placed.variant == variant
    if node:
        assert placed.node_id == node
        assert placed.gpu_ids == (f"{node}-gpu0",)
    else:
        assert placed.gpu_ids == ()


def test_pending_reason_names_each_variant() -> None:
    # A100 busy, inside its wait: only variant 0 considered, and when variant 1 joins.
    snap = snapshot(A100, ASCEND, held=(busy(A100),))
    early = plan(snap, [PendingTask.from_task(mk_task(age_s=0.2))])
    assert early.placements == ()
    (why,) = early.unplaced
    assert why.reason is Reason.INSUFFICIENT_GPUS
    assert why.message.startswith("variants[0] (nvidia/A100): insufficient_gpus: ")
    assert "variants[1] (huawei/Ascend910B) considered from 2026-01-01T12:00:00.800000" in (
        why.message
    )
    # Every wait over, the A100 busy, no Ascend, no memory left anywhere: every refusal.
    full = replace(busy(A100), memory_mb=256 * GB)
    snap = snapshot(A100, RTX, held=(full, replace(busy(RTX), memory_mb=256 * GB)))
    late = plan(snap, [PendingTask.from_task(mk_task(age_s=10))])
    (why,) = late.unplaced
    parts = why.message.split("; ")
    assert parts[0].startswith("variants[0] (nvidia/A100): ")
    assert parts[1].startswith("variants[1] (huawei/Ascend910B): gpu_type_unavailable")
    assert parts[2].startswith("variants[2] (CPU only): insufficient_memory")
    assert "considered from" not in why.message


def test_quota_counts_the_placed_variant() -> None:
    variants = [
        {"gpu_type": "nvidia/A100", "gpu_required": 4, "wait_s": 0},
        {"gpu_type": "huawei", "gpu_required": 1},
    ]
    # Quota 2 cards: the 4-card variant is refused for quota, the 1-card one placed.
    snap = snapshot(mk_node("a", "nvidia", "A100-80GB", 80, 4), ASCEND, tenant_quotas={"acme": 2})
    p = plan(snap, [PendingTask.from_task(mk_task(variants=variants))])
    (placed,) = p.placements
    assert placed.variant == 1
    # Held, the task counts its placed variant's one card, not the top level's none.
    task = mk_task(variants=variants, status=TaskStatus.RUNNING, node_id="ascend", variant=1)
    task = task.model_copy(update={"gpu_ids": ("ascend-gpu0",)})
    alloc = Allocation.from_task(task, {g.id: g for g in ASCEND.gpus})
    assert alloc.gpu_ids == ("ascend-gpu0",)
    assert placed_spec(task).gpu_required == 1 and task.spec.gpu_required == 0
    # ... and with the other variant placed, the quota refuses the 4-card one.
    refused = plan(
        snapshot(mk_node("a", "nvidia", "A100-80GB", 80, 4), tenant_quotas={"acme": 2}),
        [PendingTask.from_task(mk_task(variants=variants))],
    )
    assert "variants[0] (nvidia/A100): tenant_quota_exceeded" in refused.unplaced[0].message


def test_gpu_oom_retry_moves_to_a_variant_with_more_vram() -> None:
    variants = [
        {"gpu_type": "nvidia/RTX4090", "gpu_required": 1, "wait_s": 600},
        {"gpu_type": "huawei/Ascend910B", "gpu_required": 1},
    ]
    fresh = PendingTask.from_task(mk_task(variants=variants))
    assert plan(snapshot(RTX, ASCEND), [fresh]).placements[0].variant == 0
    # The retry engine's GPU OOM requeue: more than 24 GB, after variant 0 ran out of it.
    oom = mk_task(variants=variants, variant=0, min_vram_mb=24 * GB + 1)
    pending = PendingTask.from_task(oom, required_min_vram_mb=oom.min_vram_mb)
    assert pending.variant_floor == 0 and pending.required_min_vram_mb == 24 * GB + 1
    (placed,) = plan(snapshot(RTX, ASCEND), [pending]).placements
    assert (placed.node_id, placed.variant) == ("ascend", 1)


def test_gang_members_run_one_variant() -> None:
    variants = [
        {"gpu_type": "nvidia/A100", "gpu_required": 1, "wait_s": 1},
        {"gpu_type": "huawei/Ascend910B", "gpu_required": 1},
    ]
    # One free A100 and two Ascends: the gang of two cannot split across vendors.
    snap = snapshot(A100, mk_node("ascend", "huawei", "Ascend910B", 64, 2))
    members = [
        PendingTask.from_task(mk_task(f"m{i}", variants, age_s=age), gang_id="g", gang_size=2)
        for i in range(2)
        for age in [0.5]
    ]
    early = plan(snap, members)
    assert early.placements == () and len(early.unplaced) == 2
    assert all(u.message.startswith("variants[0] (nvidia/A100): ") for u in early.unplaced)
    late = [
        PendingTask.from_task(mk_task(f"m{i}", variants, age_s=2), gang_id="g", gang_size=2)
        for i in range(2)
    ]
    p = plan(snap, late)
    assert sorted((pl.node_id, pl.variant) for pl in p.placements) == [
        ("ascend", 1),
        ("ascend", 1),
    ]


def test_variant_spec_is_what_runs() -> None:
    body = {
        "name": "t",
        "image": "busybox:latest",
        "command": "run",
        "env": {"A": "1", "B": "2"},
        "variants": VARIANTS,
    }
    spec = parse_create(body, tenant=True)
    ascend = variant_spec(spec, 1)
    assert (ascend.gpu_type, ascend.gpu_required, ascend.image) == (
        "huawei/Ascend910B",
        1,
        "ascendai/vllm-ascend:v0.6",
    )
    assert ascend.command == "run"  # not named by the variant: the task's
    assert ascend.env == {"A": "1", "B": "2", "ASCEND_RT_VISIBLE_DEVICES": "0"}
    assert ascend.variants == ()
    cpu = variant_spec(spec, 2)
    assert (cpu.gpu_required, cpu.command) == (0, "llama-server -m /m.gguf")
    task = Task(id=TaskId("t"), tenant_id=TenantId("a"), spec=spec, created_at=NOW, updated_at=NOW)
    assert placed_spec(task) == spec  # not placed yet: its own spec
    assert placed_spec(task.model_copy(update={"variant": 2})) == cpu


def _refusal(body: dict[str, Any]) -> DomainError:
    with pytest.raises(DomainError) as err:
        parse_create({"name": "t", "image": "busybox", **body}, tenant=True)
    return err.value


@pytest.mark.parametrize(
    ("variants", "extra", "code", "fields"),
    [
        ([{"image": "UPPER CASE"}], {}, Code.INVALID_VALUE, ["variants.0.image"]),
        (
            [{"gpu_required": 1}, {"image": "bad image", "gpu_required": 1, "gpu_memory_mb": 10}],
            {},
            Code.INVALID_VALUE,
            ["variants.1.image", "variants.1.gpu_required"],
        ),
        ([{"gpu_required": "1"}], {}, Code.INVALID_VALUE, ["variants.0.gpu_required"]),
        ([{"wait_s": -1}, {}], {}, Code.INVALID_VALUE, ["variants.0.wait_s"]),
        ([{"wait_s": True}, {}], {}, Code.INVALID_VALUE, ["variants.0.wait_s"]),
        ([{"engine": "vllm"}], {}, Code.UNKNOWN_FIELD, ["variants.0.engine"]),
        ([{"env": {"HETEROFLOW_X": "1"}}], {}, Code.INVALID_VALUE, ["variants.0.env"]),
        ([{"env": None}], {}, Code.INVALID_VALUE, ["variants.0.env"]),
        ([{"gpu_required": 1}], {"gpu_type": "nvidia"}, Code.INVALID_VALUE, ["gpu_type"]),
        ([{}] * 9, {}, Code.INVALID_VALUE, ["variants"]),
        ([{"command": "x" * 20_000}], {}, Code.INVALID_VALUE, ["variants.0.command"]),
    ],
    ids=[
        "image",
        "every-bad-field",
        "string-count",
        "negative-wait",
        "bool-wait",
        "unknown",
        "reserved-env",
        "null-env",
        "top-level-cards",
        "too-many",
        "long-command",
    ],
)
def test_variant_validation_names_fields(
    variants: list[dict[str, Any]], extra: dict[str, Any], code: Code, fields: list[str]
) -> None:
    err = _refusal({"variants": variants, **extra})
    assert err.code is code
    assert err.fields == fields


def test_without_variants_unchanged() -> None:
    spec = parse_create({"name": "t", "image": "busybox", "gpu_required": 2}, tenant=True)
    assert spec.variants == ()
    task = Task(id=TaskId("t"), tenant_id=TenantId("a"), spec=spec, created_at=NOW, updated_at=NOW)
    assert placed_spec(task) is spec
    (placed,) = plan(
        snapshot(mk_node("n", "nvidia", "A100-80GB", 80, 2)), [PendingTask.from_task(task)]
    ).placements
    assert placed.variant is None and len(placed.gpu_ids) == 2


def _placed_event(**extra: Any) -> tuple[EventEnvelope, Any]:
    payload = {
        "task_id": "t1",
        "from_status": "pending",
        "to_status": "scheduled",
        "actor": "scheduler",
        "reason_code": "placed",
        "reason": "placed",
        "node_id": "ascend",
        "gpu_ids": ["ascend-gpu0"],
        "gpu_label": "huawei/Ascend910B",
        **extra,
    }
    envelope = EventEnvelope(
        event_id=uuid4(),
        position=1,
        stream_id="task-t1",
        stream_type="task",
        version=2,
        type="task_status_changed",
        occurred_at=NOW,
        payload=payload,
    )
    return envelope, parse_payload("task_status_changed", payload)


def test_a_placed_variant_is_on_the_timeline() -> None:
    (entry,) = entries_for(*_placed_event(variant=1))
    assert entry.kind == "variant_placed"
    assert entry.message == "placed variants[1] (huawei/Ascend910B) on node ascend"
    assert entry.details["variant"] == 1 and entry.details["reason_code"] == "placed"
    # A placement without variants is no timeline entry, as before.
    assert entries_for(*_placed_event()) == []


def test_group_members_run_the_variant_of_their_group() -> None:
    variants = [
        {"gpu_type": "nvidia/A100", "gpu_required": 1, "wait_s": 1},
        {"gpu_type": "huawei/Ascend910B", "gpu_required": 1},
    ]
    # One A100 and two Ascends, waits over: replica 0 takes the A100; replica 1 is held to
    # its group's variant 0 (refused) rather than taking an Ascend.
    snap = snapshot(A100, mk_node("ascend", "huawei", "Ascend910B", 64, 2))
    replicas = [
        PendingTask.from_task(mk_task(f"r{i}", variants, age_s=5, group_id="g")) for i in range(2)
    ]
    assert replicas[0].variant_group == "g"
    p = plan(snap, replicas)
    assert [(pl.task_id, pl.variant) for pl in p.placements] == [("r0", 0)]
    (why,) = p.unplaced
    assert why.message.startswith("variants[0] (nvidia/A100): insufficient_gpus")
    assert "variants[1]" not in why.message
    # A member placed earlier (variant_pin, from its siblings): the same, in a later round.
    pinned = replace(replicas[1], variant_pin=1)
    (placed,) = plan(snapshot(A100, ASCEND), [pinned]).placements
    assert (placed.node_id, placed.variant) == ("ascend", 1)


def test_group_and_job_take_variants_through_the_same_checks() -> None:
    body = {"name": "g", "image": "busybox", "task_count": 2, "variants": VARIANTS}
    group = parse_group(body | {"task_type": "training", "per_node_gpu": 4}, tenant=True)
    member = group.member_spec(1)
    assert member.variants == group.template.variants and len(member.variants) == 3
    assert member.gpu_required == 0  # the variants name the cards, not per_node_gpu
    bad = [VARIANTS[0], {"image": "Not An Image"}]
    with pytest.raises(DomainError) as err:
        parse_group(body | {"variants": bad}, tenant=True)
    assert err.value.fields == ["variants.1.image"]
    job = {"name": "j", "tasks": [{"key": "a", "name": "a", "image": "busybox", "variants": bad}]}
    with pytest.raises(DomainError) as err:
        parse_job(job, tenant=True)
    assert err.value.fields == ["tasks[0].variants.1.image"]
    ok = parse_job(
        job | {"tasks": [{"key": "a", "name": "a", "image": "busybox", "variants": VARIANTS}]},
        tenant=True,
    )
    assert len(ok.tasks[0].spec.variants) == 3


def test_gpu_oom_on_the_biggest_card_retries_when_a_later_variant_exists() -> None:
    """The retry engine gives up on a GPU OOM with no bigger card anywhere, unless a later
    variant (here CPU only) may still run."""
    nodes = {"big": NodeFacts(True, 65536, 24576, {"g-big": 24576})}
    variants: list[dict[str, Any]] = [
        {"gpu_type": "nvidia", "gpu_required": 1},
        {"command": "llama-server"},
    ]
    evidence = Evidence(
        exit_code=1,
        oom_killed=False,
        error_kind="",
        error="",
        output="CUDA out of memory",
        failed_at=NOW,
    )
    task = mk_task(
        variants=variants, status=TaskStatus.FAILED, node_id="big", variant=0
    ).model_copy(update={"gpu_ids": ("g-big",)})
    cfg = RetryConfig(retry_delay_s=0, backoff_multiplier=2, oom_memory_limit_mb=16384)
    decided, move = decide_retry(task, evidence, cfg, nodes)
    assert isinstance(decided, TaskRetryDecided) and decided.action == "retry"
    assert "after variants[0] are considered at once" in decided.reason
    assert isinstance(move, TaskStatusChanged) and move.min_vram_mb == 24577
    # The last variant ran out of memory: nothing later, so the verdict is as before.
    last = task.model_copy(update={"variant": 1})
    (gave_up,) = decide_retry(last, evidence, cfg, nodes)
    assert isinstance(gave_up, TaskRetryDecided) and gave_up.action == "give_up"


def test_a_variant_over_its_queue_max_gpus_is_refused() -> None:
    variants: list[dict[str, Any]] = [
        {"gpu_type": "nvidia", "gpu_required": 8, "wait_s": 1},
        {"gpu_type": "huawei", "gpu_required": 2},
    ]
    spec = QueueSpec(name="q", tenant="acme", quota=QueueQuota(max_gpus=4))
    queue = Queue(id="queue-q", spec=spec, created_at=NOW, updated_at=NOW)
    with pytest.raises(DomainError) as err:
        check_fits(queue, mk_task(variants=variants).spec)
    assert err.value.fields == ["variants.0.gpu_required"]
    check_fits(queue, mk_task(variants=variants[1:]).spec)  # 2 cards: fits
    job = {"name": "j", "tasks": [{"key": "a", "name": "a", "image": "x", "variants": variants}]}
    with pytest.raises(DomainError) as err:
        parse_job(job, tenant=True, queue_max_gpus=4, queue="q")
    assert err.value.fields == ["tasks[0].variants.0.gpu_required"]


def test_a_sleeping_task_lends_the_cards_of_its_placed_variant() -> None:
    asleep = mk_task(
        status=TaskStatus.SLEEPING, node_id="a100", variant=0, sleep_released=True
    ).model_copy(update={"gpu_ids": ("a100-gpu0",)})
    assert lendable(asleep)
    assert not lendable(asleep.model_copy(update={"variant": 2}))  # the CPU variant: no card
