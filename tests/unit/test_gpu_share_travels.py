"""The placed GPU share reaches the agent: a fraction placed by the planner, dispatched as a
START, and turned into a container by the docker runtime is held to exactly the VRAM and
compute the scheduler counted for it (MPS limits for silver, the MIG instance for gold)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from agent.inventory import GpuInfo, Inventory
from agent.launch import run_spec
from agent.runtimes.base import RunSpec
from agent.runtimes.docker import DockerRuntime
from agent.runtimes.sharing import MpsDaemon
from libs.domain.protocol import NodeCommand
from libs.domain.task.model import Task, TaskId, TaskSpec, TenantId
from libs.domain.task.states import TaskStatus
from services.scheduler import ClusterSnapshot, Gpu, GpuShare, Node, PendingTask, plan
from services.scheduler.dispatch import command_for

MIB = 1024 * 1024
CARD = "GPU-card"
CARD_MB = 81_920  # an 80 GB card
NOW = datetime(2026, 1, 1, tzinfo=UTC)
MPS_LIMITS = ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")


def card(mig_enabled: bool) -> Gpu:
    return Gpu(
        id=CARD,
        index=0,
        vendor="nvidia",
        model="A100-80GB",
        vram_mb=CARD_MB,
        mig_capable=True,
        mig_enabled=mig_enabled,
    )


def placed(spec: TaskSpec, gpu: Gpu) -> tuple[Task, tuple[GpuShare, ...]]:
    """The task as the planner placed it on a one-card node, and the shares it counted (one
    for a fraction, none for whole cards)."""
    task = Task(
        id=TaskId("t1"), tenant_id=TenantId("acme"), spec=spec, created_at=NOW, updated_at=NOW
    )
    node = Node(id="n1", online=True, memory_mb=65_536, cpu_cores=16, gpus=(gpu,))
    result = plan(ClusterSnapshot(now=NOW, nodes=(node,)), [PendingTask.from_task(task)])
    placement = result.placement_for(task.id)
    assert placement is not None, result.unplaced
    task = task.model_copy(
        update={
            "status": TaskStatus.SCHEDULED,
            "node_id": placement.node_id,
            "gpu_ids": placement.gpu_ids,
            "qos": placement.qos.value if placement.qos else "",
            "version": 2,
        }
    )
    return task, placement.fractions


def dispatched(task: Task, gpu: Gpu) -> NodeCommand:
    cmd = command_for(task, TaskStatus.SCHEDULED, {gpu.id: gpu})
    assert cmd is not None and cmd.run is not None
    # Over the wire: what the agent parses is what the dispatcher serialised.
    return NodeCommand.model_validate_json(cmd.model_dump_json())


def on_agent(cmd: NodeCommand, gpu: Gpu) -> RunSpec:
    info = GpuInfo(
        index=gpu.index,
        uuid=gpu.id,
        vendor=gpu.vendor,
        model=gpu.model,
        vram_mb=gpu.vram_mb,
        mig_capable=gpu.mig_capable,
        mig_enabled=gpu.mig_enabled,
    )
    inv = Inventory(node_id="n1", hostname="h", memory_mb=65_536, cpu_cores=16, gpus=(info,))
    run, _ = run_spec(cmd, inv, "n1", "127.0.0.1", "docker")
    return run


def mps_limits(run: RunSpec) -> dict[str, str]:
    rt = DockerRuntime(client=object(), mps=MpsDaemon("/run/mps-pipe", "/run/mps-log"))
    env = rt._create_kwargs(run)["environment"]
    return {k: v for k, v in env.items() if k in MPS_LIMITS}


# -- a stand-in engine and NVML for the gold start ------------------------------------------


@dataclass
class NoContainers:
    """The engine's low-level API with no container on it (the MIG choice lists through it)."""

    def containers(self, **_: Any) -> list[Any]:
        return []


@dataclass
class Engine:
    api: NoContainers = field(default_factory=NoContainers)


@dataclass
class Mem:
    total: int


@dataclass
class PartitionedCard:
    """NVML for one card partitioned into MIG instances of the given sizes (MB)."""

    sizes: tuple[int, ...]

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return uuid

    def nvmlDeviceGetMaxMigDeviceCount(self, _card: str) -> int:
        return len(self.sizes)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, _card: str, slot: int) -> tuple[str, int]:
        return (f"MIG-{self.sizes[slot]}", self.sizes[slot])

    def nvmlDeviceGetUUID(self, handle: tuple[str, int]) -> bytes:
        return handle[0].encode()

    def nvmlDeviceGetMemoryInfo(self, handle: tuple[str, int]) -> Mem:
        return Mem(handle[1] * MIB)


# A card as an operator might partition it: 1g.10gb, 2g.20gb, 3g.40gb.
INSTANCES = (10_240, 20_480, 40_960)


def mig_chosen(run: RunSpec) -> str:
    rt = DockerRuntime(client=Engine(), nvml=PartitionedCard(INSTANCES))
    mig = rt._share_sync(run)
    assert mig is not None
    return mig.uuid


def smallest_holding(mb: int) -> str:
    return f"MIG-{min(s for s in INSTANCES if s >= mb)}"


# -- the share the scheduler counted is the share the container is held to -------------------


def test_a_ratio_only_fraction_under_mps_is_limited_to_the_vram_the_scheduler_counted() -> None:
    gpu = card(mig_enabled=False)
    task, [counted] = placed(TaskSpec(name="f", image="busybox", gpu_compute_ratio=0.25), gpu)
    assert (task.qos, counted.vram_mb, counted.compute_ratio) == ("silver", 20_480, 0.25)
    limits = mps_limits(on_agent(dispatched(task, gpu), gpu))
    assert limits == {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={counted.vram_mb}M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
    }


def test_a_ratio_only_fraction_under_mig_runs_on_the_smallest_instance_holding_its_count() -> None:
    gpu = card(mig_enabled=True)
    task, [counted] = placed(TaskSpec(name="f", image="busybox", gpu_compute_ratio=0.3), gpu)
    assert (task.qos, counted.vram_mb) == ("gold", 24_576)
    run = on_agent(dispatched(task, gpu), gpu)
    assert mig_chosen(run) == smallest_holding(counted.vram_mb) == "MIG-40960"


@pytest.mark.parametrize("mig_enabled", [False, True], ids=["mps", "mig"])
def test_an_explicit_mb_fraction_is_held_to_its_mb(mig_enabled: bool) -> None:
    gpu = card(mig_enabled)
    task, [counted] = placed(TaskSpec(name="f", image="busybox", gpu_memory_mb=16_384), gpu)
    assert (counted.vram_mb, counted.compute_ratio) == (16_384, 0.2)
    run = on_agent(dispatched(task, gpu), gpu)
    if mig_enabled:
        assert mig_chosen(run) == "MIG-20480"
    else:
        # The memory limit is the request's; the compute share is the one the scheduler
        # counted for it (16 GB of an 80 GB card holds 20 %, docs/scheduling.md).
        assert mps_limits(run) == {
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=16384M",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "20",
        }


# -- the share on the wire -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        ({"gpu_compute_ratio": 0.25}, (20_480, 0.25)),
        ({"gpu_memory_mb": 16_384}, (16_384, 0.2)),
        ({"gpu_memory_mb": 8_192, "gpu_compute_ratio": 0.5}, (8_192, 0.5)),
        ({"gpu_compute_ratio": 0.0001}, (9, 0.0001)),
    ],
    ids=["ratio-only", "mb-only", "both", "tiny-ratio-rounds-vram-up"],
)
def test_the_start_carries_the_share_the_ledger_counted(
    request_: dict[str, Any], expected: tuple[int, float]
) -> None:
    gpu = card(mig_enabled=False)
    task, [counted] = placed(TaskSpec(name="f", image="busybox", **request_), gpu)
    run = dispatched(task, gpu).run
    assert run is not None and run.gpu_share is not None
    share = run.gpu_share
    assert (share.gpu_id, share.memory_mb, share.compute_ratio) == (CARD, *expected)
    assert (share.memory_mb, share.compute_ratio) == (counted.vram_mb, counted.compute_ratio)


def test_whole_cards_and_an_unknown_card_carry_no_share() -> None:
    gpu = card(mig_enabled=False)
    whole, shares = placed(TaskSpec(name="w", image="busybox", gpu_required=1), gpu)
    assert (whole.qos, whole.gpu_ids, shares) == ("", (CARD,), ())
    cmd = dispatched(whole, gpu)
    assert cmd.run is not None and cmd.run.gpu_share is None
    frac, [_] = placed(TaskSpec(name="f", image="busybox", gpu_compute_ratio=0.25), gpu)
    unread = command_for(frac, TaskStatus.SCHEDULED, {})  # the node's cards were not read
    assert unread is not None and unread.run is not None and unread.run.gpu_share is None


def test_a_start_without_a_share_still_parses_and_runs_the_specs_figures() -> None:
    # A START from a dispatcher that sent no share (queued before an upgrade).
    gpu = card(mig_enabled=False)
    task, [_] = placed(TaskSpec(name="f", image="busybox", gpu_memory_mb=4_096), gpu)
    wire = dispatched(task, gpu).model_dump(mode="json")
    del wire["run"]["gpu_share"]
    old = NodeCommand.model_validate(wire)
    assert old.run is not None and old.run.gpu_share is None
    run = on_agent(old, gpu)
    assert (run.gpu_memory_mb, run.gpu_compute_ratio) == (4_096, 0.0)
    assert mps_limits(run) == {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M"}


def test_a_share_on_a_card_that_was_not_granted_is_refused() -> None:
    gpu = card(mig_enabled=False)
    task, [_] = placed(TaskSpec(name="f", image="busybox", gpu_compute_ratio=0.25), gpu)
    wire = dispatched(task, gpu).model_dump(mode="json")
    wire["run"]["gpu_share"]["gpu_id"] = "GPU-other"
    with pytest.raises(ValidationError, match="not a granted one"):
        NodeCommand.model_validate(wire)
