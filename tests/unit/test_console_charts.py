"""The console's drawings and page figures (charts.py, dag.py, views.py) and its forms."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest

from services.api_gateway.console.charts import HEIGHT, WIDTH, bar, serving_charts, sparkline
from services.api_gateway.console.dag import draw
from services.api_gateway.console.forms import field_problems, job_body
from services.api_gateway.console.views import GROUPS_KEPT, SAMPLES, FigureLog, window_state


def points(svg: str) -> list[tuple[float, float]]:
    raw = re.search(r'points="([^"]*)"', svg)
    assert raw is not None
    return [(float(x), float(y)) for x, y in (p.split(",") for p in raw.group(1).split())]


def test_values_are_scaled_to_the_box_and_spread_over_its_width() -> None:
    svg = sparkline([0, 50, 100], 100, "GPU %")
    assert points(svg) == [(0.0, HEIGHT), (WIDTH / 2, HEIGHT / 2), (WIDTH, 0.0)]


def test_the_text_alternative_states_last_and_highest() -> None:
    svg = sparkline([10, 90, 40], 100, "GPU <util>")
    assert 'aria-label="GPU &lt;util&gt;: last 40.0, highest 90.0 of 100"' in svg
    assert "style=" not in svg and "<script" not in svg


def test_a_value_over_the_top_widens_the_scale_and_no_values_draw_nothing() -> None:
    assert min(y for _, y in points(sparkline([50, 200], 100, "x"))) == 0.0
    assert sparkline([], 100, "x") == ""


def test_a_bar_fills_its_share_and_says_the_figures() -> None:
    svg = bar(1, 4, "replicas ready")
    assert 'aria-label="replicas ready: 1 of 4"' in svg and 'width="80.0"' in svg
    assert 'aria-label="replicas ready: 0 of 0"' in bar(0, 0, "replicas ready")


def test_serving_charts_draw_one_sample_as_a_flat_line() -> None:
    one = serving_charts([{"rps": 2.0, "p95": 30.0, "ready": 1.0, "total": 2.0}])
    assert len(points(one["rps"])) == 2 and "last 2.0" in one["rps"]
    assert "replicas ready: 1 of 2" in one["ready"]
    assert serving_charts([]) == {}


def test_the_figure_log_keeps_the_newest_samples_of_the_newest_groups() -> None:
    log = FigureLog()
    answer = {"requests_per_second": 1, "latency_p95_ms": 2, "replicas": [{"ready": True}, {}]}
    for _ in range(SAMPLES + 5):
        samples = log.add("g", answer)
    assert len(samples) == SAMPLES and samples[-1] == {
        "rps": 1.0,
        "p95": 2.0,
        "ready": 1.0,
        "total": 2.0,
    }
    for i in range(GROUPS_KEPT):
        log.add(f"other-{i}", answer)
    assert len(log.add("g", answer)) == 1  # the oldest group shown was forgotten


WINDOW = {"start": "22:00", "end": "06:00", "timezone": "UTC", "action": "pause"}


@pytest.mark.parametrize(
    ("now", "is_open", "change"),
    [
        (datetime(2026, 1, 5, 23, 0, tzinfo=UTC), True, "2026-01-06T06:00+00:00"),
        (datetime(2026, 1, 6, 3, 0, tzinfo=UTC), True, "2026-01-06T06:00+00:00"),
        (datetime(2026, 1, 6, 12, 0, tzinfo=UTC), False, "2026-01-06T22:00+00:00"),
    ],
    ids=["evening", "after-midnight", "midday"],
)
def test_a_window_crossing_midnight_says_when_it_changes(
    now: datetime, is_open: bool, change: str
) -> None:
    assert window_state(WINDOW, now) == {"open": is_open, "next_change": change}


def test_a_window_on_fridays_only_opens_next_friday_and_an_all_day_one_never_changes() -> None:
    friday = WINDOW | {"days": ["fri"], "timezone": "Europe/Berlin"}
    monday = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
    assert window_state(friday, monday) == {"open": False, "next_change": "2026-01-09T22:00+01:00"}
    always = WINDOW | {"start": "00:00", "end": "00:00"}
    assert window_state(always, monday) == {"open": True, "next_change": None}
    assert window_state(None, monday) is None


JOB: list[dict[str, Any]] = [
    {"key": "b", "status": "pending", "why": "waits on <a>", "depends_on": [{"on": "a"}]},
    {"key": "a", "status": "completed", "depends_on": [], "task": {"id": "t-1"}},
    {"key": "c", "status": "skipped", "depends_on": [{"on": "a", "kind": "data"}, {"on": "b"}]},
]


def test_the_dag_has_an_arrow_per_dependency_and_status_as_text_and_symbol() -> None:
    svg = str(draw(JOB))
    assert svg.count('marker-end="url(#arrow)"') == 3
    assert svg.count('stroke-dasharray="6 4"') == 1  # the data dependency
    assert "✓ completed</text>" in svg and "⤼ skipped</text>" in svg
    assert '<a href="/ui/tasks/t-1">' in svg and "waits on &lt;a&gt;" in svg  # escaped
    assert "style=" not in svg and "<script" not in svg
    # a (depth 0) above b (1) above c (2): rows by depth.
    ys = {
        k: float(y)
        for k, y in re.findall(r"<title>(\w): [^<]*</title><rect x=\"\d+\" y=\"(\d+)\"", svg)
    }
    assert ys["a"] < ys["b"] < ys["c"], ys
    assert str(draw([])) == ""


def test_the_job_form_reads_dependency_lines_and_names_what_is_wrong() -> None:
    body, problems = job_body(
        {
            "name": "j",
            "tasks": '[{"key": "a"}]',
            "dependencies": "b after a\n\nc data a /work/out\nd condition b acc > 0.9",
        }
    )
    assert problems == {}
    assert body["dependencies"] == [
        {"task": "b", "kind": "after", "on": "a"},
        {"task": "c", "kind": "data", "on": "a", "artifact": "/work/out"},
        {"task": "d", "kind": "condition", "on": "b", "condition": "acc > 0.9"},
    ]
    assert "tasks" in job_body({"tasks": "[oops"})[1]
    assert "line 1" in job_body({"dependencies": "b needs a"})[1]["dependencies"]
    assert field_problems({"error": "e", "fields": ["tasks[1].gpus", "x.y"]}, "") == {
        "tasks": "e",
        "x": "e",
    }
    assert field_problems({"error": "e"}, "") == {"": "e"}


def test_an_arrow_over_a_row_bends_around_the_boxes_between() -> None:
    svg = str(draw(JOB))
    path = re.search(r'<path d="M([\d.]+),[\d.]+ C([\d.]+),[^"]*"[^>]*><title>c waits on a', svg)
    assert path is not None, svg
    rights = [
        float(x) + float(w) for x, w in re.findall(r'<rect x="(\d+)" y="\d+" width="(\d+)"', svg)
    ]
    assert float(path.group(2)) > max(rights)  # its bend lies right of every box
