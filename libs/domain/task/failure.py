"""Failure classifier (SPEC §4, seed 003): what went wrong, from the evidence an agent reports.

Pure: exit code, the OOM-killed flag, the runtime's error kind and message, and the tail of
the output go in; a `Failure` (class + kind + the evidence that decided it) comes out. Explicit
runtime kinds win over text; GPU out-of-memory is recognised from the frameworks' own words
(CUDA, HIP/ROCm, Ascend NPU, XPU), CPU OOM from the kernel's kill.

Whether the card or the application was at fault (XIDs, ECC, a card fallen off the bus) is
`device_fault.classify_device`, re-exported here; `classify` itself does not consult it yet.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from libs.domain.task.device_fault import DeviceFault as DeviceFault
from libs.domain.task.device_fault import DeviceVerdict as DeviceVerdict
from libs.domain.task.device_fault import classify_device as classify_device


class FailureClass(StrEnum):
    PERMANENT = "permanent"
    TRANSIENT = "transient"
    CPU_OOM = "cpu_oom"
    GPU_OOM = "gpu_oom"
    OTHER = "other"


class ErrorKind(StrEnum):
    """Why a task could not run or ended badly, as an agent reports it (SPEC §4).

    Runtimes translate their own failures into these; the classifier below maps them to a
    `FailureClass`. Carried by agent reports and by `task_status_changed.error_kind`.
    """

    IMAGE_NOT_FOUND = "ImageNotFound"
    IMAGE_PULL_BACK_OFF = "ImagePullBackOff"
    PERMISSION_DENIED = "PermissionDenied"
    INVALID_CONFIG = "InvalidConfig"
    RESOURCE_LIMIT_EXCEEDED = "ResourceLimitExceeded"
    CONTAINER_RUNTIME_ERROR = "ContainerRuntimeError"
    NETWORK_TIMEOUT = "NetworkTimeout"
    DISK_PRESSURE = "DiskPressure"
    TRANSIENT_ERROR = "TransientError"
    TASK_CANCELLED = "TaskCancelled"
    TIMEOUT = "Timeout"  # the task ran past its own timeout and was stopped

    @classmethod
    def parse(cls, text: str) -> ErrorKind | None:
        """The kind named by `text`, or None when it names none."""
        try:
            return cls(text)
        except ValueError:
            return None


PERMANENT_KINDS = frozenset(
    {
        "ImageNotFound",
        "PermissionDenied",
        "InvalidConfig",
        "ResourceLimitExceeded",
        "ImagePullBackOff",
        "TaskCancelled",
    }
)
TRANSIENT_KINDS = frozenset(
    {
        "NetworkTimeout",
        "TransientError",
        "ContainerRuntimeError",
        "DiskPressure",
    }
)

_GPU_OOM = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED"
    r"|cudaErrorMemoryAllocation|torch\.(cuda\.)?OutOfMemoryError"
    r"|HIP out of memory|hipErrorOutOfMemory|ROCm.*out of memory"
    r"|NPU out of memory|ACL_ERROR_RT_MEMORY_ALLOCATION|EL0004"
    r"|XPU out of memory|RESOURCE_EXHAUSTED: Out of memory while trying to allocate",
    re.IGNORECASE,
)
# Text that names a kind when the runtime did not (e.g. a pull error surfacing in output).
_TEXT_KINDS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"pull access denied|manifest unknown|No such image|image not found", re.I),
        "ImageNotFound",
    ),
    (
        re.compile(r"unauthorized: authentication required|ErrImagePull|ImagePullBackOff", re.I),
        "ImagePullBackOff",
    ),
    (re.compile(r"permission denied|operation not permitted", re.I), "PermissionDenied"),
    (re.compile(r"no space left on device|disk pressure", re.I), "DiskPressure"),
    (
        re.compile(
            r"connection (timed out|reset)|i/o timeout|Temporary failure in name resolution"
            r"|NCCL.*(timeout|Timeout)|ETIMEDOUT",
            re.I,
        ),
        "NetworkTimeout",
    ),
    (
        re.compile(r"OCI runtime|containerd.*error|runc.*(failed|error)", re.I),
        "ContainerRuntimeError",
    ),
)


@dataclass(frozen=True)
class Failure:
    cls: FailureClass
    kind: str  # the named kind (ImageNotFound, ...), "OOMKilled", "GpuOutOfMemory" or ""
    evidence: str  # what decided it, for the decision event's reason


def classify(
    *,
    exit_code: int | None,
    oom_killed: bool = False,
    error_kind: str = "",
    error: str = "",
    output: str = "",
) -> Failure:
    if error_kind in PERMANENT_KINDS:
        return Failure(FailureClass.PERMANENT, error_kind, f"runtime reported {error_kind}")
    if error_kind in TRANSIENT_KINDS:
        return Failure(FailureClass.TRANSIENT, error_kind, f"runtime reported {error_kind}")
    text = f"{error}\n{output}"
    gpu = _GPU_OOM.search(text)
    if gpu:
        # Checked before the OOM kill: a GPU OOM is not cured by more host memory.
        return Failure(FailureClass.GPU_OOM, "GpuOutOfMemory", f"output says {gpu.group(0)!r}")
    if oom_killed:
        return Failure(FailureClass.CPU_OOM, "OOMKilled", "killed by the memory limit (OOM)")
    for pattern, kind in _TEXT_KINDS:
        match = pattern.search(text)
        if match:
            cls = FailureClass.PERMANENT if kind in PERMANENT_KINDS else FailureClass.TRANSIENT
            return Failure(cls, kind, f"output says {match.group(0)!r}")
    if error_kind:
        return Failure(FailureClass.OTHER, error_kind, f"runtime reported {error_kind}")
    code = "unknown" if exit_code is None else str(exit_code)
    return Failure(FailureClass.OTHER, "", f"exit code {code}")
