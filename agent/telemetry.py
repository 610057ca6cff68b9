"""GPU telemetry sampling: utilisation, memory, power, temperature and health per card, for
running tasks.

NVIDIA cards are read through NVML (temperature: the GPU die; health: `nvml_health`); other
vendors' cards (`cards`, e.g. the declared AMD or Ascend ones) through their vendor tool
(agent/vendors), matched on vendor and device index. A card no backend can read reports
nothing: a missing sample is honest, a made-up one is not.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import structlog

from libs.domain.telemetry import GpuSample

from .inventory import GpuInfo, nvml_session, nvml_text
from .vendors import Runner, Which, read_vendor, run_tool

log = structlog.get_logger(__name__)
_MIB = 1024 * 1024


def sample(
    holders: dict[str, list[str]],
    at: datetime,
    nvml: Any | None = None,
    cards: Sequence[GpuInfo] = (),
    run: Runner = run_tool,
    which: Which = shutil.which,
    detect: bool = True,
) -> list[GpuSample]:
    """One sample per card a running task holds (`holders`: uuid → tasks): NVML-visible cards
    (unless `detect` is off), then the non-NVIDIA `cards` through their vendor's tool (`run`,
    `which`: test seams)."""
    if not holders:
        return []
    out = _sample_nvml(holders, at, nvml) if detect else []
    return out + _sample_vendors(holders, at, cards, {s.gpu_id for s in out}, run, which)


def _sample_vendors(
    holders: dict[str, list[str]],
    at: datetime,
    cards: Sequence[GpuInfo],
    done: set[str],
    run: Runner,
    which: Which,
) -> list[GpuSample]:
    wanted = [c for c in cards if c.uuid in holders and c.uuid not in done and c.vendor != "nvidia"]
    out: list[GpuSample] = []
    for vendor in sorted({c.vendor for c in wanted}):
        readings = {r.index: r for r in read_vendor(vendor, run, which)}
        for card in (c for c in wanted if c.vendor == vendor):
            r = readings.get(card.index)
            if r is None or r.memory_used_mb is None or r.utilization_pct is None:
                continue  # the tool does not show this card (or not its load): no sample
            out.append(
                GpuSample(
                    gpu_id=card.uuid,
                    task_ids=tuple(holders[card.uuid]),
                    utilization_pct=r.utilization_pct,
                    memory_used_mb=r.memory_used_mb,
                    memory_total_mb=r.memory_total_mb or float(card.vram_mb),
                    power_w=r.power_w,
                    temperature_c=r.temperature_c,
                    health=r.health,
                    at=at,
                )
            )
    return out


def _sample_nvml(holders: dict[str, list[str]], at: datetime, nvml: Any | None) -> list[GpuSample]:
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
                        temperature_c=_temperature(lib, handle),
                        health=nvml_health(lib, handle),
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


def _temperature(lib: Any, handle: Any) -> float | None:
    try:
        sensor = getattr(lib, "NVML_TEMPERATURE_GPU", 0)
        return float(lib.nvmlDeviceGetTemperature(handle, sensor))  # °C, the GPU die
    except Exception:  # noqa: BLE001 - NotSupported on some boards
        return None


def nvml_health(lib: Any, handle: Any) -> str:
    """A card's `health` from NVML's memory-repair state, the two cheap queries it has:
    row remapping (A100 and later: `nvmlDeviceGetRemappedRows` → corrected, uncorrected,
    pending, failure) and page retirement (older cards: `nvmlDeviceGetRetiredPagesPendingStatus`).
    A remapping failure is `critical` (the memory cannot be repaired: the card wants service);
    a remap or retirement pending is `warning` (it takes effect at the next GPU reset); a card
    that answers either query with neither is `ok`; one that answers none (NotSupported, e.g.
    consumer boards) is `unknown`. XIDs are read elsewhere (agent/xid_events.py)."""
    answered = False
    try:
        _corrected, _uncorrected, pending, failed = lib.nvmlDeviceGetRemappedRows(handle)
        if failed:
            return "critical"
        if pending:
            return "warning"
        answered = True
    except Exception:  # noqa: BLE001 - NotSupported before Ampere
        pass
    try:
        enabled = getattr(lib, "NVML_FEATURE_ENABLED", 1)
        if lib.nvmlDeviceGetRetiredPagesPendingStatus(handle) == enabled:
            return "warning"
        answered = True
    except Exception:  # noqa: BLE001 - NotSupported on boards without page retirement
        pass
    return "ok" if answered else "unknown"


def holders_of(tasks: Iterable[tuple[str, tuple[str, ...]]]) -> dict[str, list[str]]:
    """Card uuid → ids of the running tasks holding it (several when a card is shared)."""
    out: dict[str, list[str]] = {}
    for task_id, gpu_ids in tasks:
        for g in gpu_ids:
            out.setdefault(g, []).append(task_id)
    return out
