"""The scheduler benchmark's pure helpers: task mix, percentiles, target rows, rate search."""

from __future__ import annotations

import argparse
import math

import pytest

from bench import Context, Servers
from bench.floors import Floors
from bench.report import Row
from bench.scheduler import _sizes, _target, percentile
from bench.scheduler_place import MIX, task_specs
from bench.scheduler_steps import Search, Step, nearest_rank
from bench.scheduler_steps import rows as step_rows


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


def _floors(js_pipelined: float) -> Floors:
    row = Row("floor.x", 1.0, "rows/s")
    return Floors(row, row, row, row, Row("floor.js.publish_pipelined", js_pipelined, "msg/s"))


def test_the_rate_search_reports_the_highest_step_within_two_seconds() -> None:
    found = Search(
        [
            Step(50.0, submitted=400, reached=400, p50_s=0.2, p99_s=0.4),
            Step(100.0, submitted=800, reached=800, p50_s=0.3, p99_s=1.9, cpu_s=4.0, wall_s=10.0),
            Step(150.0, submitted=1200, reached=1100, p50_s=1.0, p99_s=math.inf),
        ],
        skipped=[600.0],
    )
    assert [s.within for s in found.steps] == [True, True, False]
    assert found.highest == 100.0
    ctx = Context(Servers("", "", False), _floors(2_800.0), argparse.Namespace())
    rows = {r.metric: r for r in step_rows(ctx, found, 8.0)}
    best = rows["scheduler.steady.highest_rate_p99_2s"]
    assert (best.value, best.floor) == (100.0, "floor.js.publish_pipelined")
    assert "= 400 tasks/s" in best.note and "not run (more tasks than cards): 600" in best.note
    assert rows["scheduler.steady.highest_rate_p99_2s.target"].ratio == pytest.approx(0.1)
    over = rows["scheduler.step.150_per_s.submit_to_running_p99"]
    assert math.isnan(over.value) and "1100 of 1200 running" in over.note
    cpu = rows["scheduler.step.100_per_s.cpu_per_task"]
    assert cpu.value == pytest.approx(5.0) and "0.40 of a core" in cpu.note


def test_a_task_that_never_ran_counts_as_over_the_limit() -> None:
    waits = [0.1] * 98 + [math.inf] * 2
    assert nearest_rank(waits, 99) == math.inf
    assert nearest_rank([0.1] * 99 + [math.inf], 99) == 0.1
    assert Search().highest == 0.0
