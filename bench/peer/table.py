"""The peer table: each workload's figures on Slurm and on HeteroFlow over every run, the
median of each, their ratio (HeteroFlow ÷ Slurm) and the issue's target, as Markdown."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .workloads import Results, Sizes

NAN = float("nan")


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    lower_is_better: bool
    # The target, from the medians (HeteroFlow's, Slurm's or NaN): met or not.
    target: str
    met: Callable[[float, float], bool]


def metrics(sizes: Sizes) -> list[Metric]:
    return [
        Metric(
            "burst_makespan_s",
            f"{sizes.burst} trivial jobs submitted at once: makespan",
            "s",
            True,
            "ratio ≤ 1.0",
            lambda hf, slurm: hf <= slurm,
        ),
        Metric(
            "burst_jobs_per_s",
            "same: jobs completed per second",
            "jobs/s",
            False,
            "ratio ≥ 1.0",
            lambda hf, slurm: hf >= slurm,
        ),
        Metric(
            "cpu_ms_per_job",
            "control-plane CPU per trivial job",
            "ms",
            True,
            "≤ 30 ms",
            lambda hf, _slurm: hf <= 30.0,
        ),
        Metric(
            "steady_p50_ms",
            f"{sizes.rate:g} jobs/s steady: submit → process started, p50",
            "ms",
            True,
            "",
            lambda _hf, _slurm: True,
        ),
        Metric(
            "steady_p99_ms",
            "same: p99",
            "ms",
            True,
            "ratio ≤ 0.1",
            lambda hf, slurm: hf <= 0.1 * slurm,
        ),
        Metric(
            "wide_all_running_s",
            f"{sizes.wide} `sleep {sizes.wide_sleep:g}` at once: all running after",
            "s",
            True,
            "≤ 2 s",
            lambda hf, _slurm: hf <= 2.0,
        ),
    ]


def median(values: Sequence[float]) -> float:
    measured = [v for v in values if v == v]
    return statistics.median(measured) if measured else NAN


def number(v: float) -> str:
    if v != v:
        return "–"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def cell(values: Sequence[float], unit: str) -> str:
    if not values:
        return "not run"
    runs = " / ".join(number(v) for v in values)
    return f"{number(median(values))} {unit} ({runs})" if len(values) > 1 else f"{runs} {unit}"


def ratio(m: Metric, hf: float, slurm: float) -> str:
    if hf != hf or slurm != slurm or not slurm:
        return "–"
    r = hf / slurm
    better = r < 1 if m.lower_is_better else r > 1
    return f"{r:.2f}× ({'better' if better else 'worse'})" if r != 1 else "1.00×"


def verdict(m: Metric, hf: float, slurm: float) -> str:
    if not m.target:
        return ""
    needs_slurm = "ratio" in m.target
    if hf != hf or (needs_slurm and slurm != slurm):
        return f"{m.target}: –"
    return f"{m.target}: {'met' if m.met(hf, slurm) else 'not met'}"


def render(runs: Mapping[str, Sequence[Results]], sizes: Sizes) -> str:
    """`runs`: per system name ("Slurm", "HeteroFlow"), one Results per run, in run order."""
    lines = [
        "| workload | Slurm | HeteroFlow | ratio (HeteroFlow ÷ Slurm) | target |",
        "|---|---|---|---|---|",
    ]
    for m in metrics(sizes):
        slurm = [r.get(m.key, NAN) for r in runs.get("Slurm", ())]
        hf = [r.get(m.key, NAN) for r in runs.get("HeteroFlow", ())]
        lines.append(
            f"| {m.label} | {cell(slurm, m.unit)} | {cell(hf, m.unit)} | "
            f"{ratio(m, median(hf), median(slurm))} | {verdict(m, median(hf), median(slurm))} |"
        )
    return "\n".join(lines)
