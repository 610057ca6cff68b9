"""Node inventory: NVML detection through a stand-in module, declared cards, heartbeat view."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent.inventory import (
    HIDDEN_GPUS_FILE,
    GpuInfo,
    declared_gpus,
    detect_inventory,
    detect_nvidia,
    hidden_gpu_ids,
    visible_gpu_ids,
)

GIB = 1024**3


class NVMLError(Exception):
    pass


@dataclass
class FakeCard:
    name: str | bytes
    uuid: str | bytes
    vram_bytes: int
    mig: tuple[int, int] | None = None  # (current, pending); None = not supported
    lost: bool = False


@dataclass
class FakeMemory:
    total: int


@dataclass
class FakeNvml:
    """The slice of the pynvml API the inventory uses."""

    cards: list[FakeCard] = field(default_factory=list)
    init_error: bool = False
    NVML_DEVICE_MIG_ENABLE: int = 1
    inits: int = 0
    shutdowns: int = 0

    def nvmlInit(self) -> None:
        if self.init_error:
            raise NVMLError("NVML Shared Library Not Found")
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeCard:
        card = self.cards[index]
        if card.lost:
            raise NVMLError("GPU is lost")
        return card

    def nvmlDeviceGetUUID(self, h: FakeCard) -> str | bytes:
        return h.uuid

    def nvmlDeviceGetName(self, h: FakeCard) -> str | bytes:
        return h.name

    def nvmlDeviceGetMemoryInfo(self, h: FakeCard) -> FakeMemory:
        return FakeMemory(h.vram_bytes)

    def nvmlDeviceGetMigMode(self, h: FakeCard) -> tuple[int, int]:
        if h.mig is None:
            raise NVMLError("Not Supported")
        return h.mig


def h200(uuid: str, mig: tuple[int, int] | None = (0, 0), lost: bool = False) -> FakeCard:
    return FakeCard("NVIDIA H200", uuid, 143771 * 1024 * 1024, mig, lost)


# -- NVML -------------------------------------------------------------------------------------


def test_detect_nvidia_reads_every_card() -> None:
    nvml = FakeNvml(
        [
            h200("GPU-a", mig=(1, 1)),
            h200("GPU-b", mig=(0, 0)),
            FakeCard(b"NVIDIA GeForce RTX 4090", b"GPU-c", 24 * GIB, mig=None),
        ]
    )
    gpus = detect_nvidia(nvml)
    assert [g.uuid for g in gpus] == ["GPU-a", "GPU-b", "GPU-c"]
    assert [g.index for g in gpus] == [0, 1, 2]
    assert {g.vendor for g in gpus} == {"nvidia"}
    assert gpus[0].model == "NVIDIA H200" and gpus[0].vram_mb == 143771
    assert (gpus[0].mig_capable, gpus[0].mig_enabled) == (True, True)
    assert (gpus[1].mig_capable, gpus[1].mig_enabled) == (True, False)
    assert (gpus[2].mig_capable, gpus[2].mig_enabled) == (False, False)
    assert gpus[2].model == "NVIDIA GeForce RTX 4090" and gpus[2].vram_mb == 24576
    assert not any(g.declared for g in gpus)
    assert nvml.inits == nvml.shutdowns == 1


def test_detect_nvidia_without_library_is_empty_not_an_error() -> None:
    assert detect_nvidia(FakeNvml(init_error=True)) == []


def test_detect_nvidia_on_this_host_never_raises() -> None:
    gpus = detect_nvidia()  # the real pynvml: no driver here, a real card on a GPU host
    assert all(g.vendor == "nvidia" for g in gpus)


def test_a_lost_card_is_left_out() -> None:
    nvml = FakeNvml([h200("GPU-a"), h200("GPU-b", lost=True)])
    assert [g.uuid for g in detect_nvidia(nvml)] == ["GPU-a"]
    assert visible_gpu_ids(nvml=nvml) == ["GPU-a"]


# -- declared ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("", []),
        (None, []),
        (
            "amd:MI300X:196608x2,nvidia:RTX4090:24576",
            [
                ("amd", "MI300X", 196608, 0, "decl-amd-mi300x-0"),
                ("amd", "MI300X", 196608, 1, "decl-amd-mi300x-1"),
                ("nvidia", "RTX4090", 24576, 0, "decl-nvidia-rtx4090-0"),
            ],
        ),
        (
            " intel : Max 1550 :131072 x 2",
            [
                ("intel", "Max 1550", 131072, 0, "decl-intel-max-1550-0"),
                ("intel", "Max 1550", 131072, 1, "decl-intel-max-1550-1"),
            ],
        ),
        (
            "huawei:Ascend 910B:65536",
            [("huawei", "Ascend 910B", 65536, 0, "decl-huawei-ascend-910b-0")],
        ),
        (
            '[{"vendor": "AMD", "model": "MI250", "vram_mb": 65536, "count": 2}]',
            [
                ("amd", "MI250", 65536, 0, "decl-amd-mi250-0"),
                ("amd", "MI250", 65536, 1, "decl-amd-mi250-1"),
            ],
        ),
        (
            [
                {
                    "vendor": "nvidia",
                    "model": "A100",
                    "vram_mb": 81920,
                    "uuid": "GPU-x",
                    "mig_capable": True,
                }
            ],
            [("nvidia", "A100", 81920, 0, "GPU-x")],
        ),
    ],
    ids=["empty", "none", "string", "spaces", "model-with-space", "json-text", "json-list"],
)
def test_declared_gpus(spec: Any, expected: list[tuple[str, str, int, int, str]] | None) -> None:
    if expected is None:
        with pytest.raises(ValueError):
            declared_gpus(spec)
        return
    gpus = declared_gpus(spec)
    assert [(g.vendor, g.model, g.vram_mb, g.index, g.uuid) for g in gpus] == expected
    assert all(g.declared for g in gpus)


@pytest.mark.parametrize(
    "spec",
    [
        "amd:MI300X",
        "amd:MI300X:lots",
        "amd:MI300X:1024x0x2",
        ":MI300X:1024",
        "[{]",
        '[{"vendor": "amd", "model": "MI300X"}]',
        '[{"vendor": "amd", "model": "X", "vram_mb": 1, "count": 2, "uuid": "u"}]',
        '[{"vendor": "amd", "model": "X", "vram_mb": 1, "colour": "red"}]',
        '[{"vendor": "amd", "model": "X", "vram_mb": 1, "uuid": "u"},'
        ' {"vendor": "amd", "model": "Y", "vram_mb": 1, "uuid": "u"}]',
    ],
)
def test_malformed_declarations_are_refused(spec: str) -> None:
    with pytest.raises(ValueError):
        declared_gpus(spec)


def test_declared_uuids_carry_the_node_and_continue_detected_indices() -> None:
    detected = detect_nvidia(FakeNvml([h200("GPU-a"), h200("GPU-b")]))
    gpus = declared_gpus("nvidia:L40S:46068,amd:MI300X:196608", node_id="n7", taken=detected)
    assert [(g.vendor, g.index, g.uuid) for g in gpus] == [
        ("nvidia", 2, "decl-n7-nvidia-l40s-2"),
        ("amd", 0, "decl-n7-amd-mi300x-0"),
    ]
    # stable across calls: the same card after an agent restart
    assert (
        declared_gpus("nvidia:L40S:46068,amd:MI300X:196608", node_id="n7", taken=detected) == gpus
    )


# -- heartbeat view ---------------------------------------------------------------------------


def test_visible_gpu_ids_combines_nvml_and_declared_minus_hidden(tmp_path: Path) -> None:
    nvml = FakeNvml([h200("GPU-a"), h200("GPU-b")])
    declared = declared_gpus("amd:MI300X:196608x2")
    assert visible_gpu_ids(declared, tmp_path, nvml=nvml) == [
        "GPU-a",
        "GPU-b",
        "decl-amd-mi300x-0",
        "decl-amd-mi300x-1",
    ]
    (tmp_path / HIDDEN_GPUS_FILE).write_text(
        "# pulled for the GPU-lost test\ndecl-amd-mi300x-1\n\nGPU-b  # also\n"
    )
    assert hidden_gpu_ids(tmp_path) == {"decl-amd-mi300x-1", "GPU-b"}
    assert visible_gpu_ids(declared, tmp_path, nvml=nvml) == ["GPU-a", "decl-amd-mi300x-0"]
    (tmp_path / HIDDEN_GPUS_FILE).unlink()
    assert len(visible_gpu_ids(declared, tmp_path, nvml=nvml)) == 4


def test_visible_gpu_ids_without_nvml_or_state_dir() -> None:
    declared = declared_gpus("amd:MI300X:196608")
    assert visible_gpu_ids(declared, None, detect=False) == ["decl-amd-mi300x-0"]
    assert visible_gpu_ids(declared, None, nvml=FakeNvml(init_error=True)) == ["decl-amd-mi300x-0"]
    assert hidden_gpu_ids(None) == set()


def test_detect_inventory() -> None:
    inv = detect_inventory(
        "node-1",
        declared="amd:MI300X:196608",
        labels={"zone": "a"},
        runtime="process",
        nvml=FakeNvml([h200("GPU-a", mig=(1, 0))]),
    )
    assert inv.node_id == "node-1"
    assert inv.hostname
    assert inv.memory_mb > 0 and inv.cpu_cores >= 1
    assert inv.labels == {"zone": "a"} and inv.runtime == "process"
    assert [(g.vendor, g.uuid, g.declared) for g in inv.gpus] == [
        ("nvidia", "GPU-a", False),
        ("amd", "decl-node-1-amd-mi300x-0", True),
    ]
    # JSON round trip: what the agent sends at registration
    assert type(inv).model_validate_json(inv.model_dump_json()) == inv


def test_detect_inventory_declared_only() -> None:
    inv = detect_inventory("sim-3", declared="nvidia:H100:81559x8", detect=False, hostname="sim")
    assert len(inv.gpus) == 8 and inv.hostname == "sim"
    assert all(isinstance(g, GpuInfo) and g.declared for g in inv.gpus)
