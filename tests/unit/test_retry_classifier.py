"""The failure classifier, table-driven with real-looking evidence."""

from __future__ import annotations

from typing import Any

import pytest

from libs.domain.task.failure import FailureClass, classify

C = FailureClass

CASES: list[tuple[str, dict[str, Any], FailureClass, str]] = [
    (
        "image not found",
        {
            "exit_code": None,
            "error_kind": "ImageNotFound",
            "error": "No such image: ghcr.io/acme/trainer:v9",
        },
        C.PERMANENT,
        "ImageNotFound",
    ),
    (
        "pull back-off",
        {"exit_code": None, "error_kind": "ImagePullBackOff"},
        C.PERMANENT,
        "ImagePullBackOff",
    ),
    (
        "permission denied kind",
        {"exit_code": 126, "error_kind": "PermissionDenied"},
        C.PERMANENT,
        "PermissionDenied",
    ),
    (
        "invalid config",
        {"exit_code": None, "error_kind": "InvalidConfig", "error": "invalid mount config"},
        C.PERMANENT,
        "InvalidConfig",
    ),
    (
        "resource limit",
        {"exit_code": None, "error_kind": "ResourceLimitExceeded"},
        C.PERMANENT,
        "ResourceLimitExceeded",
    ),
    ("cancelled", {"exit_code": 143, "error_kind": "TaskCancelled"}, C.PERMANENT, "TaskCancelled"),
    (
        "transient error kind",
        {"exit_code": 1, "error_kind": "TransientError", "error": "try again"},
        C.TRANSIENT,
        "TransientError",
    ),
    (
        "network timeout kind",
        {"exit_code": 1, "error_kind": "NetworkTimeout"},
        C.TRANSIENT,
        "NetworkTimeout",
    ),
    (
        "runtime error kind",
        {
            "exit_code": None,
            "error_kind": "ContainerRuntimeError",
            "error": "OCI runtime create failed",
        },
        C.TRANSIENT,
        "ContainerRuntimeError",
    ),
    (
        "disk pressure text",
        {"exit_code": 1, "output": "OSError: [Errno 28] No space left on device"},
        C.TRANSIENT,
        "DiskPressure",
    ),
    (
        "nccl timeout text",
        {"exit_code": 1, "output": "[E ProcessGroupNCCL.cpp:475] NCCL watchdog Timeout at op 42"},
        C.TRANSIENT,
        "NetworkTimeout",
    ),
    (
        "dns failure",
        {"exit_code": 1, "output": "urllib3: Temporary failure in name resolution"},
        C.TRANSIENT,
        "NetworkTimeout",
    ),
    ("cpu oom", {"exit_code": 137, "oom_killed": True}, C.CPU_OOM, "OOMKilled"),
    (
        "cuda oom",
        {
            "exit_code": 1,
            "output": (
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB "
                "(GPU 0; 7.79 GiB total capacity; 5.12 GiB already allocated)"
            ),
        },
        C.GPU_OOM,
        "GpuOutOfMemory",
    ),
    (
        "cuda oom old style",
        {"exit_code": 1, "output": "RuntimeError: CUDA error: out of memory"},
        C.GPU_OOM,
        "GpuOutOfMemory",
    ),
    (
        "hip oom",
        {"exit_code": 1, "output": "torch.OutOfMemoryError: HIP out of memory."},
        C.GPU_OOM,
        "GpuOutOfMemory",
    ),
    (
        "ascend npu oom",
        {"exit_code": 1, "output": "RuntimeError: NPU out of memory. Tried to allocate 1.00 GiB"},
        C.GPU_OOM,
        "GpuOutOfMemory",
    ),
    (
        "gpu oom wins over oom kill",
        {"exit_code": 137, "oom_killed": True, "output": "CUDA out of memory"},
        C.GPU_OOM,
        "GpuOutOfMemory",
    ),
    ("plain exit", {"exit_code": 3, "output": "Traceback ... KeyError: 'lr'"}, C.OTHER, ""),
    ("segfault", {"exit_code": 139}, C.OTHER, ""),
    (
        "unknown kind",
        {"exit_code": None, "error_kind": "Timeout", "error": "task exceeded its timeout"},
        C.OTHER,
        "Timeout",
    ),
]


@pytest.mark.parametrize(
    ("evidence", "cls", "kind"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_classify(evidence: dict[str, Any], cls: FailureClass, kind: str) -> None:
    failure = classify(**evidence)
    assert (failure.cls, failure.kind) == (cls, kind)
    assert failure.evidence
