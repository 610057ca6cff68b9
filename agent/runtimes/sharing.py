"""How a fractional card is shared inside a container, per QoS (SPEC §5; seed 000, GPU sharing).

The scheduler grants a fraction of one card and names its QoS from the card (gold: NVIDIA with
MIG mode on; silver: other NVIDIA cards; bronze: other vendors). Here that becomes isolation:

Every limit is the share the scheduler counted for the task on its card (`TaskRunSpec.gpu_share`,
see `held_share`): a fraction that names only its compute share is held to the VRAM the
scheduler accounted for it too (`ceil(ratio × card VRAM)`), and one that names only its VRAM to
the matching compute share.

* **gold**: the task gets a MIG instance of its card whose memory holds its share and
  that no running task of this node holds (the smallest that fits); the container sees that
  instance only, by its `MIG-...` UUID. Instances are not created here: an operator partitions
  the card (`nvidia-smi mig -cgi ... -C`); a card with no free instance that fits refuses the
  start with a reason, and the retry engine places the task again.
* **silver**: the node's MPS control daemon (joined when its control pipe exists, started
  otherwise); the container shares the daemon's pipe directory and the host's IPC namespace
  (MPS clients need both) and carries `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (its memory) and
  `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` (its compute share), which MPS enforces.
* **bronze**: accounting only. The container sees its card through the vendor's
  visible-device variable; nothing enforces the share (docs/scheduling.md says so).

`deploy/gpu-check/` checks the real behaviour on an NVIDIA machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from libs.domain.protocol import TaskRunSpec
from libs.domain.task.failure import ErrorKind

from ..inventory import nvml_session, nvml_text
from .base import RuntimeStartError

log = structlog.get_logger(__name__)

_MIB = 1024 * 1024
GOLD, SILVER, BRONZE = "gold", "silver", "bronze"
# Where NVIDIA's tools look by default; the agent's setting may move it.
DEFAULT_MPS_PIPE_DIR = "/tmp/nvidia-mps"
DEFAULT_MPS_LOG_DIR = "/tmp/nvidia-mps-log"
MPS_CONTROL = "nvidia-cuda-mps-control"
# How long a freshly started control daemon may take to open its pipe.
MPS_START_S = 5.0


@dataclass(frozen=True)
class MigInstance:
    uuid: str  # "MIG-..."
    memory_mb: int
    parent_uuid: str


def held_share(run: TaskRunSpec) -> tuple[int, float]:
    """(VRAM in MB, compute share) a fraction is held to: the share the scheduler counted on
    its card when the START carries one, else the spec's own figures (a START from a
    dispatcher that sent no share). Whole cards: the spec's zeros."""
    if run.gpu_share is not None:
        return run.gpu_share.memory_mb, run.gpu_share.compute_ratio
    return run.spec.gpu_memory_mb, run.spec.gpu_compute_ratio


def mig_instances(parent_uuid: str, nvml: Any | None = None) -> list[MigInstance]:
    """The MIG instances of one card, through NVML; [] without NVML or MIG. `nvml`: a
    stand-in for tests."""
    out: list[MigInstance] = []
    with nvml_session(nvml) as lib:
        if lib is None:
            return []
        try:
            card = lib.nvmlDeviceGetHandleByUUID(parent_uuid)
            slots = int(lib.nvmlDeviceGetMaxMigDeviceCount(card))
        except Exception as e:  # noqa: BLE001 - not MIG-capable, or the card is gone
            log.warning("mig_listing_failed", card=parent_uuid, error=str(e))
            return []
        for slot in range(slots):
            try:
                mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(card, slot)
            except Exception:  # noqa: BLE001, S112 - NVML_ERROR_NOT_FOUND: an empty slot
                continue
            out.append(
                MigInstance(
                    uuid=nvml_text(lib.nvmlDeviceGetUUID(mig)),
                    memory_mb=int(lib.nvmlDeviceGetMemoryInfo(mig).total) // _MIB,
                    parent_uuid=parent_uuid,
                )
            )
    return out


def choose_mig(
    instances: Collection[MigInstance], need_mb: int, taken: Collection[str]
) -> MigInstance | None:
    """The smallest free instance that holds `need_mb` (ties by UUID, so the choice is
    stable); None when none fits."""
    fits = [m for m in instances if m.uuid not in taken and m.memory_mb >= need_mb]
    return min(fits, key=lambda m: (m.memory_mb, m.uuid)) if fits else None


def mps_env(memory_mb: int, compute_ratio: float, pipe_dir: str) -> dict[str, str]:
    """What an MPS client needs to be held to its share. The container sees one card, so
    the memory limit names device 0."""
    env = {"CUDA_MPS_PIPE_DIRECTORY": pipe_dir}
    if memory_mb > 0:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={memory_mb}M"
    if compute_ratio > 0:
        percent = max(1, min(100, round(compute_ratio * 100)))
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(percent)
    return env


class MpsDaemon:
    """The node's MPS control daemon: joined when its control pipe exists, else started."""

    def __init__(
        self,
        pipe_dir: str = DEFAULT_MPS_PIPE_DIR,
        log_dir: str = DEFAULT_MPS_LOG_DIR,
        binary: str = MPS_CONTROL,
    ) -> None:
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self.binary = binary

    def running(self) -> bool:
        return (Path(self.pipe_dir) / "control").exists()

    def ensure(self) -> None:
        """Blocking (run it off the event loop). Raises RuntimeStartError when there is no
        daemon and none can be started: a silver task never runs without MPS."""
        if self.running():
            return
        exe = shutil.which(self.binary)
        if exe is None:
            raise RuntimeStartError(
                ErrorKind.CONTAINER_RUNTIME_ERROR,
                f"a silver (MPS) fraction needs the MPS control daemon: no control pipe in "
                f"{self.pipe_dir} and no {self.binary} on this node",
            )
        os.makedirs(self.pipe_dir, exist_ok=True)
        os.makedirs(self.log_dir, exist_ok=True)
        env = os.environ | {
            "CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir,
            "CUDA_MPS_LOG_DIRECTORY": self.log_dir,
        }
        try:
            subprocess.run([exe, "-d"], env=env, check=True, timeout=MPS_START_S)
        except (OSError, subprocess.SubprocessError) as e:
            raise RuntimeStartError(
                ErrorKind.CONTAINER_RUNTIME_ERROR, f"starting {self.binary} -d: {e}"
            ) from e
        deadline = time.monotonic() + MPS_START_S
        while not self.running():
            if time.monotonic() > deadline:
                raise RuntimeStartError(
                    ErrorKind.CONTAINER_RUNTIME_ERROR,
                    f"{self.binary} -d started but opened no control pipe in {self.pipe_dir}",
                )
            time.sleep(0.05)
        log.info("mps_daemon_started", pipe_dir=self.pipe_dir)
