"""Fractional cards per QoS (agent/runtimes/sharing.py): the container spec the docker runtime
builds for gold (a MIG instance), silver (MPS limits) and bronze (visibility only), the MIG
listing through a stand-in NVML, the choice of an instance, and joining or starting the MPS
control daemon (a stand-in binary on PATH; no GPU here)."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent.inventory import Inventory
from agent.launch import run_spec
from agent.runtimes.base import LABEL_MIG, RunSpec, RuntimeStartError
from agent.runtimes.docker import DockerRuntime
from agent.runtimes.sharing import (
    BRONZE,
    GOLD,
    SILVER,
    MigInstance,
    MpsDaemon,
    choose_mig,
    held_share,
    mig_instances,
    mps_env,
)
from libs.domain.protocol import CommandKind, GpuShare, NodeCommand, TaskRunSpec
from libs.domain.task.failure import ErrorKind
from libs.domain.task.model import TaskSpec
from libs.domain.task.states import TaskStatus

MIB = 1024 * 1024


def frac(qos: str, vendor: str = "nvidia", mb: int = 4096, ratio: float = 0.25) -> RunSpec:
    return RunSpec(
        task_id="t1",
        attempt=0,
        image="busybox",
        command="true",
        gpu_ids=("GPU-card",),
        gpu_vendor=vendor,
        qos=qos,
        gpu_memory_mb=mb,
        gpu_compute_ratio=ratio,
    )


# -- the container spec per QoS ------------------------------------------------------------


def test_silver_gets_the_mps_limits_the_pipe_directory_and_only_its_card() -> None:
    rt = DockerRuntime(client=object(), mps=MpsDaemon("/run/mps-pipe", "/run/mps-log"))
    kw = rt._create_kwargs(frac(SILVER, mb=4096, ratio=0.25))
    env = kw["environment"]
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/mps-pipe"
    [req] = kw["device_requests"]
    assert req["DeviceIDs"] == ["GPU-card"]
    pipes = [m for m in kw["mounts"] if m["Target"] == "/run/mps-pipe"]
    assert pipes and pipes[0]["Source"] == "/run/mps-pipe"
    assert kw["ipc_mode"] == "host"


def test_gold_sees_only_its_mig_instance() -> None:
    rt = DockerRuntime(client=object())
    mig = MigInstance("MIG-abc", 10_240, "GPU-card")
    kw = rt._create_kwargs(frac(GOLD, mb=8192), mig)
    [req] = kw["device_requests"]
    assert req["DeviceIDs"] == ["MIG-abc"]
    assert kw["labels"][LABEL_MIG] == "MIG-abc"
    assert not any(k.startswith("CUDA_MPS") for k in kw["environment"])
    assert "ipc_mode" not in kw


def test_bronze_is_visibility_only() -> None:
    rt = DockerRuntime(client=object())
    kw = rt._create_kwargs(frac(BRONZE, vendor="amd"))
    assert kw["environment"]["HIP_VISIBLE_DEVICES"] == "GPU-card"
    assert kw["environment"]["ROCR_VISIBLE_DEVICES"] == "GPU-card"
    assert not any(k.startswith("CUDA_MPS") for k in kw["environment"])
    assert "device_requests" not in kw and "ipc_mode" not in kw


def test_whole_cards_get_no_sharing() -> None:
    rt = DockerRuntime(client=object())
    whole = frac("", mb=0, ratio=0.0)
    kw = rt._create_kwargs(whole)
    assert not any(k.startswith("CUDA_MPS") for k in kw["environment"])
    assert "ipc_mode" not in kw and LABEL_MIG not in kw["labels"]


@pytest.mark.parametrize(
    ("mb", "ratio", "expected"),
    [
        (
            4096,
            0.25,
            {
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
            },
        ),
        (0, 0.5, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}),
        (2048, 0.0, {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2048M"}),
        (
            1,
            0.001,
            {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "1"},
        ),
    ],
    ids=["both", "compute-only", "memory-only", "tiny-share-rounds-up-to-1%"],
)
def test_mps_env(mb: int, ratio: float, expected: dict[str, str]) -> None:
    assert mps_env(mb, ratio, "/p") == {"CUDA_MPS_PIPE_DIRECTORY": "/p", **expected}


# -- the fraction's QoS reaches the runtime --------------------------------------------------


def start(spec: TaskSpec, qos: str) -> NodeCommand:
    return NodeCommand(
        kind=CommandKind.START,
        node_id="n1",
        task_id="t1",
        attempt=0,
        status=TaskStatus.SCHEDULED,
        run=TaskRunSpec(spec=spec, gpu_ids=("GPU-card",), qos=qos),
    )


def test_run_spec_carries_a_fractions_qos_and_share() -> None:
    inv = Inventory(node_id="n1", hostname="h", memory_mb=1024, cpu_cores=2)
    spec = TaskSpec(
        name="f", image="busybox", command="true", gpu_memory_mb=4096, gpu_compute_ratio=0.25
    )
    run, _ = run_spec(start(spec, "silver"), inv, "n1", "127.0.0.1", "docker")
    assert (run.qos, run.gpu_memory_mb, run.gpu_compute_ratio) == ("silver", 4096, 0.25)
    whole = TaskSpec(name="w", image="busybox", command="true", gpu_required=1)
    run, _ = run_spec(start(whole, "silver"), inv, "n1", "127.0.0.1", "docker")
    assert run.qos == ""


@pytest.mark.parametrize(
    ("request_", "share", "expected"),
    [
        (
            {"gpu_compute_ratio": 0.25},
            GpuShare(gpu_id="GPU-card", memory_mb=20_480, compute_ratio=0.25),
            (20_480, 0.25),
        ),
        (
            {"gpu_memory_mb": 8_192},
            GpuShare(gpu_id="GPU-card", memory_mb=8_192, compute_ratio=0.1),
            (8_192, 0.1),
        ),
        ({"gpu_compute_ratio": 0.25}, None, (0, 0.25)),
        ({"gpu_memory_mb": 8_192}, None, (8_192, 0.0)),
        ({"gpu_required": 1}, None, (0, 0.0)),
    ],
    ids=["counted-ratio-only", "counted-mb-only", "no-share-ratio", "no-share-mb", "whole-card"],
)
def test_held_share_is_the_counted_share_else_the_specs(
    request_: dict[str, Any], share: GpuShare | None, expected: tuple[int, float]
) -> None:
    spec = TaskSpec(name="f", image="busybox", **request_)
    assert held_share(TaskRunSpec(spec=spec, gpu_ids=("GPU-card",), gpu_share=share)) == expected


# -- MIG instances -----------------------------------------------------------------------------


@dataclass
class Mem:
    total: int


@dataclass
class StandInNvml:
    """NVML as far as MIG listing goes: one card with instances in some slots."""

    cards: dict[str, list[tuple[str, int] | None]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    def nvmlInit(self) -> None:
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        if uuid not in self.cards:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return uuid

    def nvmlDeviceGetMaxMigDeviceCount(self, card: str) -> int:
        return len(self.cards[card])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, card: str, slot: int) -> tuple[str, int]:
        entry = self.cards[card][slot]
        if entry is None:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return entry

    def nvmlDeviceGetUUID(self, handle: tuple[str, int]) -> bytes:
        return handle[0].encode()

    def nvmlDeviceGetMemoryInfo(self, handle: tuple[str, int]) -> Mem:
        return Mem(handle[1] * MIB)


def test_mig_instances_skip_empty_slots_and_read_uuid_and_memory() -> None:
    nvml = StandInNvml({"GPU-card": [("MIG-a", 10_240), None, ("MIG-b", 20_480)]})
    assert mig_instances("GPU-card", nvml) == [
        MigInstance("MIG-a", 10_240, "GPU-card"),
        MigInstance("MIG-b", 20_480, "GPU-card"),
    ]
    assert nvml.calls == ["init", "shutdown"]


def test_mig_instances_of_an_unknown_card_are_none() -> None:
    assert mig_instances("GPU-gone", StandInNvml({})) == []


INSTANCES = [
    MigInstance("MIG-small", 10_240, "c"),
    MigInstance("MIG-mid", 20_480, "c"),
    MigInstance("MIG-mid2", 20_480, "c"),
    MigInstance("MIG-big", 40_960, "c"),
]


@pytest.mark.parametrize(
    ("need", "taken", "expected"),
    [
        (8_000, set(), "MIG-small"),
        (8_000, {"MIG-small"}, "MIG-mid"),
        (15_000, {"MIG-mid"}, "MIG-mid2"),
        (30_000, set(), "MIG-big"),
        (30_000, {"MIG-big"}, None),
        (50_000, set(), None),
    ],
    ids=[
        "smallest-fit",
        "taken-skipped",
        "tie-by-uuid",
        "only-big-fits",
        "all-taken",
        "none-big-enough",
    ],
)
def test_choose_mig(need: int, taken: set[str], expected: str | None) -> None:
    chosen = choose_mig(INSTANCES, need, taken)
    assert (chosen.uuid if chosen else None) == expected


# -- the MPS control daemon ------------------------------------------------------------------


def fake_mps_control(bin_dir: Path) -> Path:
    """A stand-in `nvidia-cuda-mps-control`: `-d` opens the control pipe and records it."""
    exe = bin_dir / "nvidia-cuda-mps-control"
    exe.write_text(
        "#!/bin/sh\n"
        'echo "$@" >> "$CUDA_MPS_LOG_DIRECTORY/calls"\n'
        '[ "$1" = "-d" ] && touch "$CUDA_MPS_PIPE_DIRECTORY/control"\n'
    )
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_mps_daemon_is_started_once_then_joined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_mps_control(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    daemon = MpsDaemon(str(tmp_path / "pipe"), str(tmp_path / "log"))
    assert not daemon.running()
    daemon.ensure()
    assert daemon.running()
    daemon.ensure()  # joined: not started again
    assert (tmp_path / "log" / "calls").read_text().split("\n") == ["-d", ""]


def test_an_existing_daemon_is_joined_without_the_binary(tmp_path: Path) -> None:
    (tmp_path / "pipe").mkdir()
    (tmp_path / "pipe" / "control").touch()
    MpsDaemon(str(tmp_path / "pipe"), str(tmp_path / "log"), binary="no-such-binary").ensure()


def test_no_daemon_and_no_binary_refuses_the_start(tmp_path: Path) -> None:
    daemon = MpsDaemon(str(tmp_path / "pipe"), str(tmp_path / "log"), binary="no-such-binary")
    with pytest.raises(RuntimeStartError) as err:
        daemon.ensure()
    assert err.value.kind is ErrorKind.CONTAINER_RUNTIME_ERROR
    assert "MPS control daemon" in str(err.value) and "no-such-binary" in str(err.value)


def test_silver_start_ensures_the_daemon_before_anything_is_created(tmp_path: Path) -> None:
    class NoEngine:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the engine was used: {name}")

    rt = DockerRuntime(
        client=NoEngine(),
        mps=MpsDaemon(str(tmp_path / "pipe"), str(tmp_path / "log"), binary="no-such-binary"),
    )
    with pytest.raises(RuntimeStartError, match="MPS control daemon"):
        rt._share_sync(frac(SILVER))
    assert rt._share_sync(frac(BRONZE, vendor="amd")) is None
