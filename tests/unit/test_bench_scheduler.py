"""The scheduler benchmark's pure helpers: task mix, percentiles, target rows."""

from __future__ import annotations

import math

import pytest

from bench.scheduler import _sizes, _target, percentile
from bench.scheduler_place import MIX, task_specs


def test_task_specs_take_the_mix_in_turn() -> None:
    specs = task_specs(len(MIX) + 2)
    shapes = [(s.gpu_required, s.gpu_type, s.gpu_memory_mb) for s in specs]
    assert shapes[: len(MIX)] == list(MIX)
    assert shapes[len(MIX) :] == list(MIX[:2])


PERCENTILE_CASES = [
    ([], 50, math.nan, "empty"),
    ([1.0], 99, 1.0, "one"),
    ([1.0, 2.0, 3.0, 4.0], 50, 2.0, "median-nearest-rank"),
    ([float(i) for i in range(1, 101)], 99, 99.0, "p99-of-100"),
    ([float(i) for i in range(1, 101)], 100, 100.0, "max"),
]


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [c[:3] for c in PERCENTILE_CASES],
    ids=[c[3] for c in PERCENTILE_CASES],
)
def test_percentile(values: list[float], q: float, expected: float) -> None:
    got = percentile(values, q)
    assert (math.isnan(got) and math.isnan(expected)) or got == expected


TARGET_CASES = [
    (6_000.0, 5_000.0, False, 1.2, "rate-met"),
    (2_500.0, 5_000.0, False, 0.5, "rate-missed"),
    (250.0, 500.0, True, 2.0, "latency-met"),
    (1_000.0, 500.0, True, 0.5, "latency-missed"),
    (math.nan, 500.0, True, None, "nothing-measured"),
]


@pytest.mark.parametrize(
    ("value", "target", "lower", "ratio"),
    [c[:4] for c in TARGET_CASES],
    ids=[c[4] for c in TARGET_CASES],
)
def test_target_ratio_at_least_one_means_met(
    value: float, target: float, lower: bool, ratio: float | None
) -> None:
    row = _target("m", value, target, "u", lower)
    assert (row.metric, row.value, row.floor) == ("m.target", target, "m")
    assert row.ratio == (pytest.approx(ratio) if ratio is not None else None)


def test_sizes() -> None:
    assert _sizes("1000, 10000") == [1_000, 10_000]
