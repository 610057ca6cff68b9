"""Vendor telemetry parsers against recorded tool outputs (tests/fixtures/vendors/README.md)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.vendors import (
    ROCM_SMI_CALLS,
    parse_amd_smi_metric,
    parse_npu_smi_info,
    parse_rocm_smi,
    read_vendor,
    telemetry_notes,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "vendors"
MIB = 1024 * 1024


def _text(name: str) -> str:
    return (FIX / name).read_text()


def test_npu_smi_info_two_chips() -> None:
    cards = parse_npu_smi_info(_text("ascend/npu-smi-info.txt"))
    assert [c.index for c in cards] == [0, 1]
    first, second = cards
    assert (first.power_w, first.temperature_c, first.health) == (162.6, 34.0, "ok")
    assert (first.memory_used_mb, first.memory_total_mb) == (3419.0, 65536.0)
    assert first.utilization_pct == 0.0 and first.bus_id == "0000:9D:00.0"
    assert second.power_w is None  # "-": not reported for the second chip
    assert (second.memory_used_mb, second.temperature_c) == (2874.0, 34.0)


def test_npu_smi_health_column() -> None:
    text = _text("ascend/npu-smi-info.txt").replace(
        "| OK            | 162.6", "| Critical      | 162.6"
    )
    assert [c.health for c in parse_npu_smi_info(text)] == ["critical", "ok"]


def test_amd_smi_metric() -> None:
    (card,) = parse_amd_smi_metric(_text("amd/amd-smi-metric.json"))
    assert card.index == 0
    assert (card.utilization_pct, card.power_w, card.temperature_c) == (2.0, 20.0, 41.0)
    assert (card.memory_used_mb, card.memory_total_mb) == (14569.0, 16368.0)
    assert card.health == "unknown"


def test_rocm_smi_merges_calls() -> None:
    (card,) = parse_rocm_smi(
        _text("amd/rocm-smi-use-meminfo.json"), _text("amd/rocm-smi-power-temp.json")
    )
    assert card.index == 0 and card.utilization_pct == 0.0
    assert card.memory_used_mb == pytest.approx(27856896 / MIB)
    assert card.memory_total_mb == pytest.approx(21458059264 / MIB)
    assert (card.power_w, card.temperature_c) == (222.0, 103.0)  # junction before edge


def test_amd_falls_back_to_rocm_smi() -> None:
    outputs = {
        ROCM_SMI_CALLS[0]: _text("amd/rocm-smi-use-meminfo.json"),
        ROCM_SMI_CALLS[1]: _text("amd/rocm-smi-power-temp.json"),
    }

    def run(cmd: Sequence[str]) -> str:
        return outputs[tuple(cmd)]

    (card,) = read_vendor("amd", run, lambda tool: "/usr/bin/x" if tool == "rocm-smi" else None)
    assert card.power_w == 222.0


def test_missing_tool_is_a_note_not_a_crash() -> None:
    def run(cmd: Sequence[str]) -> str:
        raise AssertionError("no tool: nothing runs")

    assert read_vendor("amd", run, lambda tool: None) == []
    assert read_vendor("huawei", run, lambda tool: None) == []
    notes = telemetry_notes(["amd", "huawei", "nvidia", "hygon"], lambda tool: None, run)
    assert notes == {
        "amd": "amd-smi not found on PATH; rocm-smi not found on PATH;"
        " these cards report no metrics",
        "huawei": "npu-smi not found on PATH; these cards report no metrics",
        "hygon": "no telemetry backend for this vendor; these cards report no metrics",
    }
    npu = _text("ascend/npu-smi-info.txt")
    assert telemetry_notes(["huawei"], lambda tool: "/usr/bin/npu-smi", lambda cmd: npu) == {}


def test_failing_or_garbled_tool_is_a_note_naming_each_try() -> None:
    import subprocess

    def run(cmd: Sequence[str]) -> str:
        if cmd[0] == "amd-smi":
            raise subprocess.CalledProcessError(2, list(cmd))
        return "Segmentation fault"  # rocm-smi prints something that is not JSON

    notes = telemetry_notes(["amd", "ascend"], lambda tool: "/usr/bin/" + tool, run)
    assert notes["amd"].startswith(
        "amd-smi failed (exit status 2); rocm-smi printed unreadable output ("
    )
    # npu-smi answers, but its output has no card rows in it.
    assert notes["ascend"] == "npu-smi reported no cards; these cards report no metrics"


def test_amd_falls_back_to_rocm_smi_when_amd_smi_fails() -> None:
    outputs = {
        ROCM_SMI_CALLS[0]: _text("amd/rocm-smi-use-meminfo.json"),
        ROCM_SMI_CALLS[1]: _text("amd/rocm-smi-power-temp.json"),
    }

    def run(cmd: Sequence[str]) -> str:
        if cmd[0] == "amd-smi":
            raise OSError("amd-smi: library not loaded")
        return outputs[tuple(cmd)]

    (card,) = read_vendor("amd", run, lambda tool: "/usr/bin/" + tool)
    assert card.power_w == 222.0


def test_failing_tool_gives_no_readings() -> None:
    def run(cmd: Sequence[str]) -> str:
        raise OSError("exit status 1")

    assert read_vendor("huawei", run, lambda tool: "/usr/bin/npu-smi") == []


def test_sample_reads_declared_ascend_cards_through_npu_smi() -> None:
    from datetime import UTC, datetime

    from agent.inventory import declared_gpus
    from agent.telemetry import sample

    cards = declared_gpus("huawei:Ascend910B:65536x2", node_id="n1")
    held = {cards[1].uuid: ["t1"]}
    npu = _text("ascend/npu-smi-info.txt")
    at = datetime(2026, 1, 1, tzinfo=UTC)
    (s,) = sample(held, at, cards=cards, run=lambda cmd: npu, which=lambda t: "/x", detect=False)
    assert (s.gpu_id, s.task_ids, s.memory_used_mb, s.memory_total_mb) == (
        cards[1].uuid,
        ("t1",),
        2874.0,
        65536.0,
    )
    assert (s.temperature_c, s.health, s.power_w) == (34.0, "ok", None)
    # No tool on PATH: no sample, no exception.
    assert sample(held, at, cards=cards, which=lambda t: None, detect=False) == []


async def test_card_lending_vram_reads_the_vendor_tool(tmp_path: Path) -> None:
    import shutil

    from agent.engine import vram_held_mb
    from agent.inventory import declared_gpus
    from agent.vendors import recorded_tools

    shutil.copy(FIX / "amd" / "amd-smi-metric.json", tmp_path / "amd-smi-metric-json")
    cards = declared_gpus("amd:RX7800XT:16368", node_id="n1")
    held = await vram_held_mb((cards[0].uuid,), False, None, cards, recorded_tools(tmp_path))
    assert held == 14569.0
    assert await vram_held_mb((cards[0].uuid,), False, None, cards, (str, lambda t: None)) is None


class FakeAmdSmi:
    """A stand-in for the `amdsmi` Python module: an MI300X (current socket power, hotspot) and
    an older card (average power only, no hotspot sensor, uncorrectable ECC errors)."""

    class AmdSmiTemperatureType:
        EDGE, HOTSPOT = 0, 1

    class AmdSmiTemperatureMetric:
        CURRENT = 0

    def __init__(self, init_error: Exception | None = None) -> None:
        self.init_error = init_error
        self.shut = False

    def amdsmi_init(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def amdsmi_shut_down(self) -> None:
        self.shut = True

    def amdsmi_get_processor_handles(self) -> list[str]:
        return ["h0", "h1"]

    def amdsmi_get_gpu_activity(self, h: str) -> dict[str, object]:
        return {"gfx_activity": 87 if h == "h0" else 5, "umc_activity": 3, "mm_activity": "N/A"}

    def amdsmi_get_gpu_vram_usage(self, h: str) -> dict[str, int]:
        return {"vram_total": 196592 if h == "h0" else 65520, "vram_used": 1024}

    def amdsmi_get_power_info(self, h: str) -> dict[str, object]:
        if h == "h0":
            return {"current_socket_power": 350, "average_socket_power": "N/A"}
        return {"current_socket_power": 0xFFFFFFFF, "average_socket_power": 120}

    def amdsmi_get_temp_metric(self, h: str, sensor: int, metric: int) -> int:
        if h == "h1" and sensor == self.AmdSmiTemperatureType.HOTSPOT:
            raise RuntimeError("AMDSMI_STATUS_NOT_SUPPORTED")
        return 55 if sensor == self.AmdSmiTemperatureType.HOTSPOT else 40

    def amdsmi_get_gpu_total_ecc_count(self, h: str) -> dict[str, int]:
        return {"correctable_count": 7, "uncorrectable_count": 2 if h == "h1" else 0}


def test_amdsmi_library_is_read_first() -> None:
    lib = FakeAmdSmi()

    def run(cmd: Sequence[str]) -> str:
        raise AssertionError("the library answered: no tool runs")

    first, second = read_vendor("amd", run, lambda tool: "/usr/bin/" + tool, load=lambda n: lib)
    assert (first.index, first.utilization_pct, first.power_w, first.temperature_c) == (
        0,
        87.0,
        350.0,
        55.0,
    )
    assert (first.memory_used_mb, first.memory_total_mb, first.health) == (1024, 196592, "unknown")
    # No current socket power (UINT32_MAX): the average; no hotspot sensor: the edge.
    assert (second.index, second.power_w, second.temperature_c) == (1, 120.0, 40.0)
    assert second.health == "critical"  # uncorrectable ECC errors
    assert lib.shut


def test_amdsmi_library_failing_falls_back_to_the_tools() -> None:
    lib = FakeAmdSmi(init_error=RuntimeError("AMDSMI_STATUS_DRIVER_NOT_LOADED"))
    metric = _text("amd/amd-smi-metric.json")
    (card,) = read_vendor(
        "amd", lambda cmd: metric, lambda tool: "/usr/bin/" + tool, load=lambda n: lib
    )
    assert card.power_w == 20.0  # from `amd-smi metric --json`
    notes = telemetry_notes(["amd"], lambda tool: None, lambda cmd: "", load=lambda n: None)
    assert notes == {
        "amd": "amdsmi Python library not installed; amd-smi not found on PATH;"
        " rocm-smi not found on PATH; these cards report no metrics"
    }
    notes = telemetry_notes(["amd"], lambda tool: None, lambda cmd: "", load=lambda n: lib)
    assert notes["amd"].startswith("amdsmi failed (AMDSMI_STATUS_DRIVER_NOT_LOADED); amd-smi")
