"""One telemetry interface for every accelerator vendor the agent knows.

Each backend reads its vendor's tool and gives, per card (by the vendor's device index), a
`CardReading`: utilisation %, memory used/total (MiB), power (W), temperature (°C) and `health`.
NVIDIA stays on NVML (agent/telemetry.py); AMD reads the `amdsmi` Python library where it is
installed, else its CLI `amd-smi metric --json`, else `rocm-smi --json`; Ascend parses
`npu-smi info`. A vendor's sources are tried in order; one whose tool is absent, fails or prints
something unreadable is skipped. A vendor none of whose sources answers gives no readings and a
note saying why for each (`telemetry_notes`, the node inventory's `telemetry`), never an
exception.

`health` is one of `ok`, `warning`, `critical` or `unknown` (the tool does not say).
"""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

_MIB = 1024 * 1024
HEALTH_VALUES = ("ok", "warning", "critical", "unknown")

#: Runs a command, returns its stdout; raises on failure (a test seam).
Runner = Callable[[Sequence[str]], str]
#: Finds a tool on PATH, like shutil.which (a test seam).
Which = Callable[[str], str | None]


@dataclass(frozen=True)
class CardReading:
    index: int  # the vendor's device index (declared cards match on vendor + index)
    utilization_pct: float | None
    memory_used_mb: float | None
    memory_total_mb: float | None
    power_w: float | None
    temperature_c: float | None
    health: str = "unknown"
    bus_id: str = ""


def run_tool(cmd: Sequence[str]) -> str:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=True, timeout=15).stdout


def _num(value: Any) -> float | None:
    """A number from a tool's field: 42, "42", "42.0", {"value": 42}, "N/A" → None."""
    if isinstance(value, dict):
        value = value.get("value")
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    m = re.match(r"^\s*(-?\d+(?:\.\d+)?)", str(value))
    return float(m.group(1)) if m else None


# -- AMD ------------------------------------------------------------------------------------


def parse_amd_smi_metric(text: str) -> list[CardReading]:
    """`amd-smi metric --json`: a list of per-GPU objects ({"value", "unit"} leaves)."""
    data = json.loads(text)
    if isinstance(data, dict):  # some versions wrap the list
        data = data.get("gpu_data", [data])
    out: list[CardReading] = []
    for gpu in data:
        usage = gpu.get("usage") if isinstance(gpu.get("usage"), dict) else {}
        power = gpu.get("power") if isinstance(gpu.get("power"), dict) else {}
        temp = gpu.get("temperature") if isinstance(gpu.get("temperature"), dict) else {}
        mem = gpu.get("mem_usage") if isinstance(gpu.get("mem_usage"), dict) else {}
        ecc = gpu.get("ecc") if isinstance(gpu.get("ecc"), dict) else {}
        uncorrectable = _num(ecc.get("total_uncorrectable_count"))
        out.append(
            CardReading(
                index=int(gpu["gpu"]),
                utilization_pct=_num(usage.get("gfx_activity")),
                memory_used_mb=_num(mem.get("used_vram")),
                memory_total_mb=_num(mem.get("total_vram")),
                power_w=_num(power.get("socket_power")),
                temperature_c=_num(temp.get("hotspot")) or _num(temp.get("edge")),
                health="critical" if uncorrectable else "unknown",
            )
        )
    return out


def _first(fields: dict[str, Any], *patterns: str) -> float | None:
    for pattern in patterns:
        for key, value in fields.items():
            if re.fullmatch(pattern, key, flags=re.IGNORECASE):
                number = _num(value)
                if number is not None:
                    return number
    return None


def parse_rocm_smi(*texts: str) -> list[CardReading]:
    """`rocm-smi ... --json` outputs ({"card0": {...}}), merged by card: several calls (use and
    memory; power and temperature) describe the same cards."""
    cards: dict[int, dict[str, Any]] = {}
    for text in texts:
        for key, fields in json.loads(text).items():
            m = re.fullmatch(r"card(\d+)", key)
            if m and isinstance(fields, dict):
                cards.setdefault(int(m.group(1)), {}).update(fields)
    out: list[CardReading] = []
    for index, f in sorted(cards.items()):
        used = _first(f, r"VRAM Total Used Memory \(B\)")
        total = _first(f, r"VRAM Total Memory \(B\)")
        out.append(
            CardReading(
                index=index,
                utilization_pct=_first(f, r"GPU use \(%\)"),
                memory_used_mb=None if used is None else used / _MIB,
                memory_total_mb=None if total is None else total / _MIB,
                power_w=_first(
                    f,
                    r"Current Socket Graphics Package Power \(W\)",
                    r"Average Graphics Package Power \(W\)",
                ),
                temperature_c=_first(
                    f,
                    r"Temperature \(Sensor junction\) \(C\)",
                    r"Temperature \(Sensor edge\) \(C\)",
                ),
                bus_id=str(f.get("PCI Bus", "")),
            )
        )
    return out


ROCM_SMI_CALLS = (
    ("rocm-smi", "--showuse", "--showmeminfo", "vram", "--json"),
    ("rocm-smi", "--showpower", "--showtemp", "--json"),
)


def _read_amd_smi(run: Runner) -> list[CardReading]:
    return parse_amd_smi_metric(run(("amd-smi", "metric", "--json")))


def _read_rocm_smi(run: Runner) -> list[CardReading]:
    return parse_rocm_smi(*(run(cmd) for cmd in ROCM_SMI_CALLS))


_UNSUPPORTED = (0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF)  # what amdsmi sets an unsupported field to


def _lib_num(value: Any) -> float | None:
    number = _num(value)
    return None if number is None or number in _UNSUPPORTED else number


def _lib_call(fn: Callable[..., Any], *args: Any) -> Any:
    """One amdsmi query; None when the card does not support it (AmdSmiLibraryException)."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - NOT_SUPPORTED and friends: the field is absent
        return None


def read_amdsmi(lib: Any) -> list[CardReading]:
    """AMD cards through the `amdsmi` Python library (ROCm's, what `amd-smi` itself wraps), by
    processor-handle order (amd-smi's `gpu` index): `amdsmi_get_gpu_activity` (gfx_activity %),
    `amdsmi_get_gpu_vram_usage` (vram_used/vram_total, MB), `amdsmi_get_power_info`
    (current_socket_power on MI300 and later, else average_socket_power, W),
    `amdsmi_get_temp_metric` (hotspot, else edge, °C) and `amdsmi_get_gpu_total_ecc_count`
    (uncorrectable > 0 → `critical`). A query the card does not support leaves its field empty;
    `amdsmi_init` failing raises (the next source is tried)."""
    lib.amdsmi_init()
    try:
        out: list[CardReading] = []
        temp_types, metric = lib.AmdSmiTemperatureType, lib.AmdSmiTemperatureMetric.CURRENT
        for index, handle in enumerate(lib.amdsmi_get_processor_handles()):
            activity = _lib_call(lib.amdsmi_get_gpu_activity, handle) or {}
            vram = _lib_call(lib.amdsmi_get_gpu_vram_usage, handle) or {}
            power = _lib_call(lib.amdsmi_get_power_info, handle) or {}
            ecc = _lib_call(lib.amdsmi_get_gpu_total_ecc_count, handle) or {}
            temperature = None
            for sensor in ("HOTSPOT", "EDGE"):
                temperature = _lib_num(
                    _lib_call(
                        lib.amdsmi_get_temp_metric, handle, getattr(temp_types, sensor), metric
                    )
                )
                if temperature is not None:
                    break
            watts = _lib_num(power.get("current_socket_power"))
            uncorrectable = _lib_num(ecc.get("uncorrectable_count"))
            out.append(
                CardReading(
                    index=index,
                    utilization_pct=_lib_num(activity.get("gfx_activity")),
                    memory_used_mb=_lib_num(vram.get("vram_used")),
                    memory_total_mb=_lib_num(vram.get("vram_total")),
                    power_w=watts
                    if watts is not None
                    else _lib_num(power.get("average_socket_power")),
                    temperature_c=temperature,
                    health="critical" if uncorrectable else "unknown",
                )
            )
        return out
    finally:
        try:
            lib.amdsmi_shut_down()
        except Exception as e:  # noqa: BLE001
            log.debug("amdsmi shutdown failed", error=str(e))


def load_library(name: str) -> Any | None:
    """The Python module `name`, or None when it is not installed or does not load (amdsmi
    loads libamd_smi.so at import: a missing ROCm is an ImportError or OSError)."""
    try:
        return importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - absent or broken: the tools are tried instead
        log.debug("library unavailable", library=name, error=str(e))
        return None


def read_amd(run: Runner = run_tool, which: Which = shutil.which) -> list[CardReading]:
    return read_vendor("amd", run, which, strict=True)


# -- Huawei Ascend --------------------------------------------------------------------------

_NPU_HEALTH = {"ok": "ok", "warning": "warning", "alarm": "warning", "critical": "critical"}


def parse_npu_smi_info(text: str) -> list[CardReading]:
    """`npu-smi info`: each chip is two table rows, `| NPU Name | Health | Power Temp Hugepages |`
    then `| Chip Phy-ID | Bus-Id | AICore Memory-Usage HBM-Usage |`. The device index is the
    chip's Phy-ID (what ASCEND_VISIBLE_DEVICES names)."""
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.strip().startswith("|") and line.count("|") >= 4
    ]
    out: list[CardReading] = []
    for first, second in zip(rows, rows[1:], strict=False):
        if len(first) < 3 or len(second) < 3 or not re.match(r"^\d+\s", first[0] + " "):
            continue
        if not re.fullmatch(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.\d", second[1]):
            continue
        power_temp = first[2].split()
        numbers = re.findall(r"(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)", second[2])
        hbm = numbers[-1] if numbers else None
        chip = second[0].split()
        out.append(
            CardReading(
                index=int(chip[1] if len(chip) > 1 else chip[0]),
                utilization_pct=_num(second[2].split()[0]),
                memory_used_mb=float(hbm[0]) if hbm else None,
                memory_total_mb=float(hbm[1]) if hbm else None,
                power_w=_num(power_temp[0]) if power_temp else None,
                temperature_c=_num(power_temp[1]) if len(power_temp) > 1 else None,
                health=_NPU_HEALTH.get(first[1].lower(), "unknown"),
                bus_id=second[1],
            )
        )
    return out


def _read_npu_smi(run: Runner) -> list[CardReading]:
    return parse_npu_smi_info(run(("npu-smi", "info")))


def read_ascend(run: Runner = run_tool, which: Which = shutil.which) -> list[CardReading]:
    return read_vendor("huawei", run, which, strict=True)


# -- the interface --------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """One way to read a vendor's cards: a tool on PATH (`tool`) run through `read(runner)`,
    or, with `library`, the Python module `tool` passed to `read(module)`."""

    tool: str
    read: Callable[[Any], list[CardReading]]
    library: bool = False


#: vendor → its sources, tried in order. NVIDIA is read through NVML (agent/telemetry.py).
_AMD = (
    Source("amdsmi", read_amdsmi, library=True),
    Source("amd-smi", _read_amd_smi),
    Source("rocm-smi", _read_rocm_smi),
)
_ASCEND = (Source("npu-smi", _read_npu_smi),)
BACKENDS: dict[str, tuple[Source, ...]] = {"amd": _AMD, "huawei": _ASCEND, "ascend": _ASCEND}


class TelemetryUnavailable(Exception):
    """No source of a vendor gave readings; the message says why, per source."""


def _short(error: Exception) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 120 else text[:117] + "..."


def read_vendor(
    vendor: str,
    run: Runner = run_tool,
    which: Which = shutil.which,
    *,
    strict: bool = False,
    load: Callable[[str], Any | None] | None = None,
) -> list[CardReading]:
    """Readings of one vendor's cards from its first source that answers: a source whose tool
    is absent, fails or prints something unreadable is skipped for the next one. With nothing
    read: [] (logged), or with `strict` a `TelemetryUnavailable` saying why for each source.

    A library source is loaded through `load`; by default (`load` None) only alongside the
    real tools (`run` is `run_tool`): a recorded-outputs or stand-in runner never reaches the
    host's own library."""
    vendor = vendor.lower()
    sources = BACKENDS.get(vendor)
    if load is None and run is run_tool:
        load = load_library
    reasons: list[str] = []
    if sources is None:
        reasons.append("no telemetry backend for this vendor")
    for source in sources or ():
        target: Any = run
        if source.library:
            if load is None:
                continue
            target = load(source.tool)
            if target is None:
                reasons.append(f"{source.tool} Python library not installed")
                continue
        elif not which(source.tool):
            reasons.append(f"{source.tool} not found on PATH")
            continue
        try:
            readings = source.read(target)
        except subprocess.CalledProcessError as e:
            reasons.append(f"{source.tool} failed (exit status {e.returncode})")
            continue
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
            reasons.append(f"{source.tool} printed unreadable output ({_short(e)})")
            continue
        except Exception as e:  # noqa: BLE001 - a tool that fails gives no readings, not a crash
            reasons.append(f"{source.tool} failed ({_short(e)})")
            continue
        if readings:
            return readings
        reasons.append(f"{source.tool} reported no cards")
    if strict:
        raise TelemetryUnavailable("; ".join(reasons))
    if sources is not None:
        log.warning("vendor_telemetry_failed", vendor=vendor, error="; ".join(reasons))
    return []


def recorded_name(cmd: Sequence[str]) -> str:
    """Where a recorded output of `cmd` is kept: `amd-smi metric --json` → `amd-smi-metric-json`."""
    return re.sub(r"[^A-Za-z0-9]+", "-", " ".join(cmd)).strip("-")


def recorded_tools(directory: Path) -> tuple[Runner, Which]:
    """A runner and a `which` that answer from recorded outputs under `directory` instead of
    running the tools (simulated nodes: a declared card's telemetry goes through the same parser
    as a real tool's). A tool is present when one of its outputs is recorded."""

    def run(cmd: Sequence[str]) -> str:
        return (directory / recorded_name(cmd)).read_text()

    def which(tool: str) -> str | None:
        found = any(p.name.startswith(recorded_name([tool]) + "-") for p in directory.glob("*"))
        return str(directory) if found else None

    return run, which


def telemetry_notes(
    vendors: Iterable[str],
    which: Which = shutil.which,
    run: Runner = run_tool,
    load: Callable[[str], Any | None] | None = None,
) -> dict[str, str]:
    """vendor → why its cards on this node report no metrics, for each vendor of the node's
    cards whose telemetry cannot be read here (each source tried once, as a sample would);
    vendors read fine are left out. NVIDIA (NVML) is not probed here."""
    notes: dict[str, str] = {}
    for vendor in sorted({v.lower() for v in vendors} - {"nvidia"}):
        try:
            read_vendor(vendor, run, which, strict=True, load=load)
        except TelemetryUnavailable as e:
            notes[vendor] = f"{e}; these cards report no metrics"
    return notes
