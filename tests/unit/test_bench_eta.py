"""The ETA benchmark (bench/eta.py): deterministic for a seed, and its estimates are the API's."""

from __future__ import annotations

import math

from bench.eta import rows, simulate


def test_the_same_seed_gives_the_same_rows_and_waiting_tasks_get_an_answer() -> None:
    first, again = rows(simulate(150, 7)), rows(simulate(150, 7))
    assert first == again
    by = {r.metric: r.value for r in first}
    assert by["eta.waited"] > 0 and not math.isnan(by["eta.abs_error.p50"])
    assert 0.0 <= by["eta.in_range"] <= 1.0 and by["eta.abs_error.p90"] >= by["eta.abs_error.p50"]
