"""NVML sampling against a stand-in library, and energy integration: pure logic."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from agent.telemetry import holders_of, sample
from libs.domain.task.energy import PowerSample, task_energy

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MIB = 1024 * 1024


class FakeNvml:
    """Two cards; the second reports no power (NotSupported), as some boards do."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        return f"GPU-{h}".encode()

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=40 + h, memory=10)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(used=1024 * MIB, total=81920 * MIB)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        if h == 1:
            raise RuntimeError("NotSupported")
        return 250_000


def test_sample_reads_held_cards_only() -> None:
    holders = holders_of([("t1", ("GPU-0",)), ("t2", ("GPU-1",)), ("t3", ("GPU-1",))])
    got = {s.gpu_id: s for s in sample(holders, T0, nvml=FakeNvml())}
    assert got["GPU-0"].power_w == 250.0 and got["GPU-0"].utilization_pct == 40
    assert got["GPU-0"].memory_used_mb == 1024 and got["GPU-0"].task_ids == ("t1",)
    assert got["GPU-1"].power_w is None and got["GPU-1"].task_ids == ("t2", "t3")
    assert sample(holders_of([("t9", ("GPU-9",))]), T0, nvml=FakeNvml()) == []


class RepairNvml(FakeNvml):
    """Four cards: rows remapped fine; a remapping failure; page retirement pending (a card
    before row remapping); neither query nor the temperature supported (a consumer board)."""

    NVML_TEMPERATURE_GPU = 0
    NVML_FEATURE_ENABLED = 1

    def nvmlDeviceGetCount(self) -> int:
        return 4

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        if h == 3 or sensor != self.NVML_TEMPERATURE_GPU:
            raise RuntimeError("NotSupported")
        return 60 + h

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        if h >= 2:
            raise RuntimeError("NotSupported")
        return (3, 1, 0, 1) if h == 1 else (2, 0, 0, 0)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> int:
        if h == 3:
            raise RuntimeError("NotSupported")
        return 1 if h == 2 else 0


def test_nvml_temperature_and_health() -> None:
    holders = {f"GPU-{i}": ["t1"] for i in range(4)}
    got = {s.gpu_id: (s.temperature_c, s.health) for s in sample(holders, T0, nvml=RepairNvml())}
    assert got == {
        "GPU-0": (60.0, "ok"),
        "GPU-1": (61.0, "critical"),  # a remapping failure: the memory cannot be repaired
        "GPU-2": (62.0, "warning"),  # retirement pending until the next reset
        "GPU-3": (None, "unknown"),  # NVML says nothing either way
    }
    # A card with an older driver (no such calls at all) is "unknown", not a failed sample.
    assert {s.health for s in sample({"GPU-0": ["t1"]}, T0, nvml=FakeNvml())} == {"unknown"}


def test_no_nvml_means_no_samples() -> None:
    class Broken(FakeNvml):
        def nvmlInit(self) -> None:
            raise RuntimeError("driver not loaded")

    assert sample({"GPU-0": ["t1"]}, T0, nvml=Broken()) == []


def series(
    power: float | None, n: int = 7, every: int = 10, shared: int = 1, gpu: str = "g0"
) -> list[PowerSample]:
    return [PowerSample(gpu, T0 + timedelta(seconds=i * every), power, shared) for i in range(n)]


@pytest.mark.parametrize(
    ("samples", "fraction", "kwh", "estimated", "measured"),
    [
        (series(300.0), None, 0.005, False, True),  # 300 W for 60 s = 5 Wh
        (series(300.0, shared=2), None, 0.0025, True, True),
        (series(300.0), 0.25, 0.00125, True, True),
        (series(300.0) + series(100.0, gpu="g1"), None, 0.005 + 0.005 / 3, False, True),
        (series(300.0, n=2, every=600), None, 0.0, False, True),  # a gap is not bridged
        (series(None), None, 0.0, False, False),
        ([], None, 0.0, False, False),
    ],
    ids=["one card", "shared card", "fraction", "two cards", "gap", "no power", "no samples"],
)
def test_energy(
    samples: list[PowerSample], fraction: float | None, kwh: float, estimated: bool, measured: bool
) -> None:
    result = task_energy(samples, fraction=fraction, carbon_g_per_kwh=500)
    assert result["kwh"] == pytest.approx(kwh, abs=1e-6)
    assert result["carbon_kg"] == pytest.approx(kwh * 0.5, abs=1e-6)
    assert result["estimated"] is estimated and result["measured"] is measured
