"""Benchmark results: one `Row` per number, an aligned plain-text table, a JSON document.

A row may name a floor (another row of the same run) and carry the ratio to it, so every
number is read against what the raw server did on the same machine at the same time.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Row:
    metric: str
    value: float
    unit: str
    floor: str = ""
    ratio: float | None = None
    note: str = ""


def against(metric: str, value: float, unit: str, floor: Row, note: str = "") -> Row:
    """A row compared with `floor` (same unit): ratio = value / floor."""
    ratio = value / floor.value if floor.value else None
    return Row(metric, value, unit, floor.metric, ratio, note)


def target(metric: str, value: float, goal: float, unit: str, lower_is_better: bool = False) -> Row:
    """`<metric>.target`: ratio >= 1 means met (measured/goal, or goal/measured for a time)."""
    num, den = (goal, value) if lower_is_better else (value, goal)
    return Row(f"{metric}.target", goal, unit, metric, num / den if den else None)


def _value(v: float) -> str:
    if v != v:  # NaN: nothing was measured
        return "-"
    if abs(v) >= 100 or float(v).is_integer():
        return f"{v:,.0f}"
    return f"{v:,.2f}" if abs(v) >= 1 else f"{v:.3f}"


def format_table(rows: Sequence[Row]) -> str:
    """Aligned columns: metric, value, unit, floor, ratio (numbers right-aligned)."""
    header = ("metric", "value", "unit", "floor", "ratio")
    cells = [
        (
            r.metric,
            _value(r.value),
            r.unit,
            r.floor or "-",
            f"{r.ratio:.2f}" if r.ratio is not None else "-",
        )
        for r in rows
    ]
    widths = [max(len(c[i]) for c in [header, *cells]) for i in range(len(header))]
    right = (False, True, False, False, True)

    def line(cols: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cols, widths, right, strict=True)
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(c) for c in cells)])


def environment() -> dict[str, Any]:
    """What the numbers depend on, recorded next to them."""
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, "-m", "bench", *sys.argv[1:]]),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }


def _record(row: Row) -> dict[str, Any]:
    doc = {k: v for k, v in asdict(row).items() if v not in ("", None)}
    if row.value != row.value:  # NaN is not JSON: nothing was measured
        doc["value"] = None
    return doc


def write_json(path: Path, suites: Mapping[str, Sequence[Row]], meta: dict[str, Any]) -> None:
    """`meta` should hold `environment()` as taken when the run started."""
    doc = {
        **meta,
        "suites": {name: [_record(r) for r in rows] for name, rows in suites.items()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
