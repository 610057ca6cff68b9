"""The console's inline charts (services/api_gateway/console/charts.py)."""

from __future__ import annotations

import re

from services.api_gateway.console.charts import HEIGHT, WIDTH, sparkline


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
