"""`python -m bench peer` end to end at toy sizes: HeteroFlow (embedded servers, process
runtime, 64 declared CPUs) and, where Debian's slurm-wlm and munge are installed and the
test runs as root, the single-node Slurm of bench/peer/slurm-setup.sh."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.peer.systems import slurm_missing

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TOY = ["--runs", "1", "--burst", "12", "--rate", "5", "--steady-s", "2", "--wide", "6"]
TOY += ["--wide-sleep", "1"]
KEYS = {
    "burst_makespan_s",
    "burst_jobs_per_s",
    "cpu_ms_per_job",
    "steady_p50_ms",
    "steady_p99_ms",
    "wide_all_running_s",
}


def run_peer(tmp_path: Path, *args: str) -> tuple[str, dict[str, list[dict[str, float]]]]:
    out = tmp_path / "peer.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "peer", *TOY, *args, "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, json.loads(out.read_text())["runs"]


def check_figures(figures: dict[str, float]) -> None:
    assert set(figures) == KEYS, figures
    assert all(v > 0 for v in figures.values()), figures
    assert figures["wide_all_running_s"] < 60  # six at once on a 64-CPU node, not in turn


def test_heteroflow_alone(tmp_path: Path) -> None:
    stdout, runs = run_peer(tmp_path, "--only", "heteroflow")
    check_figures(runs["HeteroFlow"][0])
    assert "| 12 trivial jobs submitted at once: makespan | not run |" in stdout


@pytest.mark.skipif(bool(slurm_missing()), reason="slurm-wlm and munge are not installed")
@pytest.mark.skipif(os.geteuid() != 0, reason="slurmd must run as root")
def test_slurm_alone(tmp_path: Path) -> None:
    stdout, runs = run_peer(tmp_path, "--only", "slurm")
    check_figures(runs["Slurm"][0])
    assert "| workload | Slurm | HeteroFlow |" in stdout
    assert "| 12 trivial jobs submitted at once: makespan | not run |" not in stdout
