"""GPU telemetry sampling through NVML: utilisation, memory and power per card, for running tasks.

Only cards NVML can see report numbers. Declared cards (other vendors, tests) report
nothing: a missing sample is honest, a made-up one is not.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import structlog

from libs.domain.telemetry import GpuSample

from .inventory import nvml_session, nvml_text

log = structlog.get_logger(__name__)
_MIB = 1024 * 1024


def sample(holders: dict[str, list[str]], at: datetime, nvml: Any | None = None) -> list[GpuSample]:
    """One sample per NVML-visible card that a running task holds (`holders`: uuid → tasks)."""
    if not holders:
        return []
    out: list[GpuSample] = []
    with nvml_session(nvml) as lib:
        if lib is None:
            return []
        for index in range(int(lib.nvmlDeviceGetCount())):
            try:
                handle = lib.nvmlDeviceGetHandleByIndex(index)
                uuid = nvml_text(lib.nvmlDeviceGetUUID(handle))
                if uuid not in holders:
                    continue
                util = lib.nvmlDeviceGetUtilizationRates(handle)
                mem = lib.nvmlDeviceGetMemoryInfo(handle)
                out.append(
                    GpuSample(
                        gpu_id=uuid,
                        task_ids=tuple(holders[uuid]),
                        utilization_pct=float(util.gpu),
                        memory_used_mb=mem.used / _MIB,
                        memory_total_mb=mem.total / _MIB,
                        power_w=_power(lib, handle),
                        at=at,
                    )
                )
            except Exception as e:  # noqa: BLE001 - a card that does not answer gives no sample
                log.warning("nvml_sample_failed", index=index, error=str(e))
    return out


def _power(lib: Any, handle: Any) -> float | None:
    try:
        return float(lib.nvmlDeviceGetPowerUsage(handle)) / 1000.0  # milliwatts
    except Exception:  # noqa: BLE001 - NotSupported on some boards
        return None


def holders_of(tasks: Iterable[tuple[str, tuple[str, ...]]]) -> dict[str, list[str]]:
    """Card uuid → ids of the running tasks holding it (several when a card is shared)."""
    out: dict[str, list[str]] = {}
    for task_id, gpu_ids in tasks:
        for g in gpu_ids:
            out.setdefault(g, []).append(task_id)
    return out
