"""`python -m bench serve-peer`: the table's ranges, the issue's targets, wrk's output read."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from bench.serve_peer.load import parse_wrk
from bench.serve_peer.table import (
    DIRECT,
    HAPROXY,
    HETEROFLOW,
    RAY,
    floors,
    render,
    span,
    targets,
)


def _fig(
    c1: float, c16: float, c64: float, p50: float, p99: float, sse: float, failed: float
) -> dict[str, float]:
    return {
        "c1_rate": c1, "c16_rate": c16, "c64_rate": c64, "c1_p50": p50,
        "c16_p99": p99, "sse_rate": sse, "s256_failed": failed,
    }  # fmt: skip


def test_span_is_min_to_max_and_skips_missing() -> None:
    rounds = [{"c1_rate": 903.0}, {"c1_rate": 946.4}, {}, {"c1_rate": math.nan}]
    assert span(rounds, "c1_rate", ",.0f") == "903–946"
    assert span([{"c1_rate": 5.0}], "c1_rate", ",.0f") == "5"
    assert span([{}], "c1_rate", ",.0f") == "–"


def test_targets_judge_worst_heteroflow_round_against_best_peer() -> None:
    results = {
        DIRECT: [_fig(9000, 13000, 13000, 0.10, 2.0, 40000, 0)],
        HETEROFLOW: [
            _fig(3000, 3300, 3400, 0.35, 10.0, 33000, 0),
            _fig(3000, 3200, 3100, 0.38, 12.0, 34000, 0),  # falls 16→64
        ],
        RAY: [_fig(300, 1000, 900, 3.0, 30.0, 22000, 0), _fig(300, 1100, 900, 3.0, 25.0, 22000, 0)],
    }
    got = {name: verdict for name, verdict, _ in targets(results)}
    assert got == {
        "c=16 ≥ 3× Ray": "FAIL",  # 3200 < 3 × 1100
        "c=16 ≥ 25 % of direct": "FAIL",  # 3200 < 0.25 × 13000 = 3250
        "c=16 p99 ≤ ½ Ray's": "PASS",  # 12 ≤ 12.5
        "c=1 added p50 ≤ 0.3 ms": "PASS",  # 0.38 − 0.10 = 0.28
        "no fall c=1→16→64": "FAIL",
        "SSE ≥ 80 % of direct": "PASS",  # 33000 ≥ 32000
        "256 streams: none fails": "PASS",
    }


def test_targets_without_ray_are_not_judged() -> None:
    results = {DIRECT: [_fig(1, 1, 1, 0.1, 1, 1, 0)], HETEROFLOW: [_fig(1, 1, 1, 0.1, 1, 1, 3)]}
    got = {name: verdict for name, verdict, _ in targets(results)}
    assert got["c=16 ≥ 3× Ray"] == "n/a"
    assert got["256 streams: none fails"] == "FAIL"
    table = render(results | {RAY: []}, {RAY: "ray[serve] not importable"})
    assert "| Ray Serve | ray[serve] not importable |" in table


def test_floors_set_heteroflow_beside_haproxy_on_the_same_machine() -> None:
    results = {
        HETEROFLOW: [_fig(3000, 9000, 8000, 0.2, 10, 1, 0), _fig(3000, 9500, 8200, 0.2, 10, 1, 0)],
        HAPROXY: [_fig(6000, 12000, 10000, 0.1, 5, 1, 0), _fig(6000, 11000, 12500, 0.1, 5, 1, 0)],
    }
    assert floors(results) == [
        "floor  HAProxy no fall c=1→16→64: 1/2 rounds",
        "floor  HeteroFlow c=16 rate / HAProxy's: 9,000 / 12,000 = 75%",
        "floor  HeteroFlow c=64 rate / HAProxy's: 8,000 / 12,500 = 64%",
    ]
    assert floors({HETEROFLOW: results[HETEROFLOW], HAPROXY: []}) == []


def test_parse_wrk_latency_output() -> None:
    text = """Running 1s test @ http://127.0.0.1:1/v1/answer
  Latency Distribution
     50%   84.00us
     75%  120.00us
     90%    1.20ms
     99%    5.91ms
  7000 requests in 1.00s, 1.00MB read
Requests/sec:   7090.10
"""
    assert parse_wrk(text) == (7090.10, 0.084, 5.91)
    failing = text + "  Non-2xx or 3xx responses: 3500\n"
    assert parse_wrk(failing) == (7090.10 / 2, 0.084, 5.91)


@pytest.mark.slow
def test_serve_peer_quick_runs_end_to_end() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "serve-peer", "--quick", "--rounds", "1", "--no-ray",
         "--no-haproxy"],
        capture_output=True, text=True, timeout=60, env=os.environ, check=True,
    ).stdout  # fmt: skip
    rows = {line.split(" | ")[0]: line for line in out.splitlines() if line.startswith("| ")}
    assert "| HeteroFlow /serve/{id}/..." in rows
    assert rows["| HeteroFlow /serve/{id}/..."].count("–") == 0  # every figure measured
    assert "(--no-ray)" in rows["| Ray Serve"]
    assert "(--no-haproxy)" in rows[f"| {HAPROXY}"]
    assert "256 streams: none fails" in out
