"""Energy of a task from its GPU power samples (pure).

Power is integrated per card with the trapezoid rule between consecutive samples; a gap
longer than `max_gap_s` is not bridged (no invented watts). A card shared with other tasks,
or held as a fraction, contributes its apportioned share and the result says `estimated`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class PowerSample:
    gpu_id: str
    at: datetime
    power_w: float | None
    shared_by: int = 1


def task_energy(
    samples: Iterable[PowerSample],
    *,
    fraction: float | None,
    carbon_g_per_kwh: float,
    max_gap_s: float = 60.0,
) -> dict[str, object]:
    by_card: dict[str, list[PowerSample]] = defaultdict(list)
    for s in samples:
        if s.power_w is not None:
            by_card[s.gpu_id].append(s)
    cards = []
    total_wh = 0.0
    # Apportioned whenever the task had less than a whole card to itself.
    estimated = (fraction is not None and fraction < 1.0) or any(
        p.shared_by > 1 for points in by_card.values() for p in points
    )
    for gpu_id, points in sorted(by_card.items()):
        points.sort(key=lambda s: s.at)
        wh = 0.0
        for a, b in zip(points, points[1:], strict=False):
            dt = (b.at - a.at).total_seconds()
            if 0 < dt <= max_gap_s:
                pa = (a.power_w or 0.0) * _share(a, fraction)
                pb = (b.power_w or 0.0) * _share(b, fraction)
                wh += (pa + pb) / 2 * dt / 3600
        total_wh += wh
        cards.append(
            {
                "gpu_id": gpu_id,
                "kwh": round(wh / 1000, 6),
                "power_curve": [
                    {"t": p.at.isoformat(), "power_w": p.power_w, "shared_by": p.shared_by}
                    for p in points
                ],
            }
        )
    kwh = total_wh / 1000
    return {
        "kwh": round(kwh, 6),
        "carbon_kg": round(kwh * carbon_g_per_kwh / 1000, 6),
        "carbon_g_per_kwh": carbon_g_per_kwh,
        "estimated": estimated,
        "measured": bool(cards),
        "cards": cards,
    }


def _share(s: PowerSample, fraction: float | None) -> float:
    """The task's share of a card's power at one sample."""
    if fraction is not None:
        return fraction
    return 1.0 / max(s.shared_by, 1)
