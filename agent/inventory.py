"""What a node offers: host memory and CPUs, and its GPUs, detected or declared.

NVIDIA cards are detected through NVML (`pynvml`); every other vendor, and every test, uses a
declared inventory from configuration. A missing NVML library or driver is not an error: the
node simply reports no detected NVIDIA cards. Heartbeats carry `visible_gpu_ids`, the cards seen
right now, which is what GPU-lost detection (SPEC §3) compares across heartbeats.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from libs.domain.node.model import DEFAULT_PORT_RANGE

log = structlog.get_logger(__name__)

#: A file under the agent's state dir listing GPU uuids to report as unseen (a test seam for
#: GPU-lost detection; one uuid per line, `#` starts a comment).
HIDDEN_GPUS_FILE = "hidden_gpus"

_MIB = 1024 * 1024
_DECLARED = re.compile(
    r"^(?P<vendor>[A-Za-z][\w-]*)\s*:\s*(?P<model>[^:]*[^:\s])\s*:\s*(?P<vram>\d+)"
    r"(?:\s*x\s*(?P<count>\d+))?$"
)


class GpuInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0)  # device index within its vendor
    uuid: str = Field(min_length=1)
    vendor: str  # lowercase: nvidia, amd, intel, huawei, …
    model: str
    vram_mb: int = Field(ge=0)
    mig_capable: bool = False
    mig_enabled: bool = False
    declared: bool = False  # from configuration rather than detected


class Inventory(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    node_id: str
    hostname: str
    memory_mb: int
    cpu_cores: int
    labels: dict[str, str] = Field(default_factory=dict)
    gpus: tuple[GpuInfo, ...] = ()
    runtime: str = ""  # the runtime this node's agent uses: docker, process, simulated
    isolation: str = ""  # what keeps tenants' networks apart: docker | iptables | none
    userns_remap: bool = False  # docker: dockerd remaps user namespaces (root is not host root)
    cgroups: str = ""  # process: how task limits are enforced, v2 | v1 | none
    # The machine (its /etc/machine-id) and the host ports the scheduler allocates there.
    host_id: str = ""
    port_range: tuple[int, int] = DEFAULT_PORT_RANGE


# -- NVIDIA ---------------------------------------------------------------------------------


def nvml_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@contextmanager
def nvml_session(nvml: Any | None) -> Iterator[Any | None]:
    """Yield an initialised NVML module, or None when the library or driver is absent."""
    lib: Any = nvml
    if lib is None:
        try:
            import pynvml

            lib = pynvml
        except ImportError:
            yield None
            return
    try:
        lib.nvmlInit()
    except Exception as e:  # noqa: BLE001 - no library, no driver, no device: all mean "none"
        log.debug("nvml unavailable", error=str(e))
        yield None
        return
    try:
        yield lib
    finally:
        try:
            lib.nvmlShutdown()
        except Exception as e:  # noqa: BLE001
            log.debug("nvml shutdown failed", error=str(e))


def _mig_mode(nvml: Any, handle: Any) -> tuple[bool, bool]:
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except Exception:  # noqa: BLE001 - NotSupported on cards without MIG
        return False, False
    return True, bool(current == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1))


def detect_nvidia(nvml: Any | None = None) -> list[GpuInfo]:
    """NVIDIA cards through NVML; [] when NVML is absent. A card that fails to answer is
    left out (so it reads as unseen), never an exception. `nvml`: a stand-in for tests."""
    gpus: list[GpuInfo] = []
    with nvml_session(nvml) as lib:
        if lib is None:
            return []
        try:
            count = int(lib.nvmlDeviceGetCount())
        except Exception as e:  # noqa: BLE001
            log.warning("nvml device count failed", error=str(e))
            return []
        for index in range(count):
            try:
                handle = lib.nvmlDeviceGetHandleByIndex(index)
                mig_capable, mig_enabled = _mig_mode(lib, handle)
                gpus.append(
                    GpuInfo(
                        index=index,
                        uuid=nvml_text(lib.nvmlDeviceGetUUID(handle)),
                        vendor="nvidia",
                        model=nvml_text(lib.nvmlDeviceGetName(handle)),
                        vram_mb=int(lib.nvmlDeviceGetMemoryInfo(handle).total) // _MIB,
                        mig_capable=mig_capable,
                        mig_enabled=mig_enabled,
                    )
                )
            except Exception as e:  # noqa: BLE001 - e.g. "GPU is lost": report it unseen
                log.warning("nvml device query failed", index=index, error=str(e))
    return gpus


def _nvidia_uuids(nvml: Any | None) -> list[str]:
    uuids: list[str] = []
    with nvml_session(nvml) as lib:
        if lib is None:
            return []
        try:
            count = int(lib.nvmlDeviceGetCount())
        except Exception:  # noqa: BLE001
            return []
        for index in range(count):
            try:
                uuids.append(
                    nvml_text(lib.nvmlDeviceGetUUID(lib.nvmlDeviceGetHandleByIndex(index)))
                )
            except Exception:  # noqa: BLE001 - an unreadable card is an unseen card
                continue
    return uuids


# -- declared inventory ---------------------------------------------------------------------


class _DeclaredEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    vendor: str = Field(min_length=1)
    model: str = Field(min_length=1)
    vram_mb: int = Field(ge=0)
    count: int = Field(default=1, ge=1, le=1024)
    uuid: str | None = None  # only with count == 1
    mig_capable: bool = False


def _parse_entries(spec: str | Sequence[Any]) -> list[_DeclaredEntry]:
    if isinstance(spec, str):
        text = spec.strip()
        if not text:
            return []
        if text.startswith("["):
            return _parse_entries(json.loads(text))
        entries = []
        for part in (p.strip() for p in text.split(",")):
            m = _DECLARED.match(part)
            if not m:
                raise ValueError(f"declared GPU {part!r}: expected vendor:model:vram_mb[xcount]")
            entries.append(
                _DeclaredEntry(
                    vendor=m["vendor"],
                    model=m["model"].strip(),
                    vram_mb=int(m["vram"]),
                    count=int(m["count"] or 1),
                )
            )
        return entries
    try:
        entries = [_DeclaredEntry.model_validate(item) for item in spec]
    except ValidationError as e:
        raise ValueError(f"declared GPUs: {e}") from e
    for entry in entries:
        if entry.uuid and entry.count != 1:
            raise ValueError("declared GPUs: a uuid names one card; use count 1")
    return entries


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "gpu"


def declared_gpus(
    spec: str | Sequence[Any] | None, node_id: str = "", taken: Iterable[GpuInfo] = ()
) -> list[GpuInfo]:
    """Parse a declared inventory: `"amd:MI300X:196608x2,nvidia:RTX4090:24576"` or a JSON list
    of `{"vendor", "model", "vram_mb", "count", "uuid", "mig_capable"}`.

    Indices continue after the `taken` cards of the same vendor. Generated uuids are stable
    (`decl-[<node_id>-]<vendor>-<model>-<index>`), so a declared card is the same card across
    agent restarts. Raises ValueError on a malformed spec: a misconfigured node must not start.
    """
    if spec is None:
        return []
    next_index: dict[str, int] = {}
    for gpu in taken:
        next_index[gpu.vendor] = max(next_index.get(gpu.vendor, 0), gpu.index + 1)
    prefix = f"decl-{node_id}-" if node_id else "decl-"
    gpus: list[GpuInfo] = []
    for entry in _parse_entries(spec):
        vendor = entry.vendor.lower()
        for _ in range(entry.count):
            index = next_index.get(vendor, 0)
            next_index[vendor] = index + 1
            gpus.append(
                GpuInfo(
                    index=index,
                    uuid=entry.uuid or f"{prefix}{vendor}-{_slug(entry.model)}-{index}",
                    vendor=vendor,
                    model=entry.model,
                    vram_mb=entry.vram_mb,
                    mig_capable=entry.mig_capable,
                    declared=True,
                )
            )
    uuids = [g.uuid for g in gpus]
    if len(set(uuids)) != len(uuids):
        raise ValueError("declared GPUs: duplicate uuid")
    return gpus


# -- heartbeat view -------------------------------------------------------------------------


def hidden_gpu_ids(state_dir: Path | str | None) -> set[str]:
    """UUIDs listed in `<state_dir>/hidden_gpus` (test seam: report those cards as unseen)."""
    if state_dir is None:
        return set()
    try:
        text = (Path(state_dir) / HIDDEN_GPUS_FILE).read_text()
    except FileNotFoundError:
        return set()
    return {line.split("#", 1)[0].strip() for line in text.splitlines()} - {""}


def visible_gpu_ids(
    declared: Sequence[GpuInfo] = (),
    state_dir: Path | str | None = None,
    nvml: Any | None = None,
    detect: bool = True,
) -> list[str]:
    """UUIDs of the cards this node sees now: NVML's answer plus the declared cards, minus any
    listed in the hidden-GPUs file. `detect=False` skips NVML (simulated nodes)."""
    seen = _nvidia_uuids(nvml) if detect else []
    seen += [g.uuid for g in declared if g.uuid not in seen]
    hidden = hidden_gpu_ids(state_dir)
    return [uuid for uuid in seen if uuid not in hidden]


# -- host -----------------------------------------------------------------------------------


def host_memory_mb() -> int:
    return int(psutil.virtual_memory().total // _MIB)


def host_cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def detect_inventory(
    node_id: str,
    *,
    declared: str | Sequence[Any] | None = None,
    labels: dict[str, str] | None = None,
    hostname: str | None = None,
    detect: bool = True,
    runtime: str = "",
    nvml: Any | None = None,
) -> Inventory:
    """The node's inventory for registration: detected NVIDIA cards, then declared cards.
    `detect=False` uses only the declared cards (simulated nodes, tests)."""
    detected = detect_nvidia(nvml) if detect else []
    gpus = detected + declared_gpus(declared, node_id=node_id, taken=detected)
    return Inventory(
        node_id=node_id,
        hostname=hostname or socket.gethostname(),
        memory_mb=host_memory_mb(),
        cpu_cores=host_cpu_cores(),
        labels=dict(labels or {}),
        gpus=tuple(gpus),
        runtime=runtime,
    )
