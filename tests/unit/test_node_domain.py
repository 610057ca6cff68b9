"""Node fold and the GPU-lost / recovered counters (SPEC §3: 3 misses, 2 sightings)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from libs.domain.node.decide import watch_card
from libs.domain.node.events import GpuLost, GpuRecovered, NodeOffline, NodeRegistered
from libs.domain.node.evolve import evolve_node
from libs.domain.node.model import CardWatch, GpuCard, NodeInventory, NodeStatus
from libs.domain.reasons import ReasonCode

AT = datetime(2026, 1, 1, tzinfo=UTC)
INV = NodeInventory(
    memory_mb=1024,
    cpu_cores=4,
    gpus=(GpuCard(id="g0", index=0, vendor="nvidia", model="A100", vram_mb=81920),),
)


def run(seq: str, excluded: bool = False) -> list[str | None]:
    """Feed a string of heartbeats ('v' visible, '-' missing); return crossings."""
    watch, out = CardWatch(), []
    for ch in seq:
        watch, crossing = watch_card(watch, ch == "v", excluded)
        if crossing == "lost":
            excluded = True
        elif crossing == "recovered":
            excluded = False
        out.append(crossing)
    return out


@pytest.mark.parametrize(
    ("seq", "excluded", "expected"),
    [
        ("--", False, [None, None]),
        ("---", False, [None, None, "lost"]),
        ("--v--", False, [None] * 5),
        ("----", False, [None, None, "lost", None]),
        ("---vv", False, [None, None, "lost", None, "recovered"]),
        ("---v-v", False, [None, None, "lost", None, None, None]),
        ("vv", True, [None, "recovered"]),
        ("v", True, [None]),
        ("vvv", False, [None, None, None]),
    ],
    ids=[
        "two misses",
        "third miss",
        "interrupted",
        "stays lost",
        "two sightings",
        "broken sightings",
        "excluded seen twice",
        "seen once",
        "healthy",
    ],
)
def test_card_watch(seq: str, excluded: bool, expected: list[str | None]) -> None:
    assert run(seq, excluded) == expected


def test_node_fold() -> None:
    node = evolve_node(None, NodeRegistered(node_id="n1", inventory=INV), AT, 1)
    assert node.status is NodeStatus.ONLINE and node.version == 1
    node = evolve_node(node, GpuLost(node_id="n1", gpu_id="g0", missed_heartbeats=3), AT, 2)
    assert node.excluded_gpus == ("g0",)
    node = evolve_node(
        node, NodeOffline(node_id="n1", silent_seconds=12, reason_code=ReasonCode.NODE_LOST), AT, 3
    )
    assert node.status is NodeStatus.OFFLINE
    node = evolve_node(node, NodeRegistered(node_id="n1", inventory=INV), AT, 4)
    assert node.status is NodeStatus.ONLINE and node.excluded_gpus == ("g0",)
    node = evolve_node(node, GpuRecovered(node_id="n1", gpu_id="g0", seen_heartbeats=2), AT, 5)
    assert node.excluded_gpus == ()
    with pytest.raises(ValueError):
        evolve_node(None, GpuLost(node_id="n2", gpu_id="g", missed_heartbeats=3), AT, 1)
