"""The peer benchmark's pure parts: the table (ratio, targets, missing Slurm), the choice of
systems, and the CPU accounting read from /proc."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

import bench.peer as peer
from bench.peer import cpu
from bench.peer.systems import HeteroFlow
from bench.peer.table import metrics, ratio, render, verdict
from bench.peer.workloads import Sizes, measure

SIZES = Sizes(burst=500, rate=10, wide=64, wide_sleep=10)
SLURM = {
    "burst_makespan_s": 27.4,
    "burst_jobs_per_s": 18.3,
    "cpu_ms_per_job": 15.0,
    "steady_p50_ms": 2029.0,
    "steady_p99_ms": 3853.0,
    "wide_all_running_s": 1.2,
}
HF = {
    "burst_makespan_s": 58.0,
    "burst_jobs_per_s": 8.6,
    "cpu_ms_per_job": 146.0,
    "steady_p50_ms": 141.0,
    "steady_p99_ms": 291.0,
    "wide_all_running_s": 5.7,
}


def row(table: str, start: str) -> list[str]:
    line = next(x for x in table.splitlines() if x.startswith(f"| {start}"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_table_has_every_run_the_median_the_ratio_and_the_target() -> None:
    table = render({"Slurm": [SLURM] * 3, "HeteroFlow": [HF, HF | {"burst_makespan_s": 60}]}, SIZES)
    assert table.splitlines()[0].startswith("| workload | Slurm | HeteroFlow | ratio")
    burst = row(table, "500 trivial jobs submitted at once: makespan")
    assert burst[1] == "27.4 s (27.4 / 27.4 / 27.4)"
    assert burst[2] == "59.0 s (58.0 / 60.0)"
    assert burst[3] == "2.15× (worse)" and burst[4] == "ratio ≤ 1.0: not met"
    p99 = row(table, "same: p99")
    assert p99[3] == "0.08× (better)" and p99[4] == "ratio ≤ 0.1: met"
    assert row(table, "64 `sleep 10` at once")[4] == "≤ 2 s: not met"


def test_table_without_slurm_leaves_ratios_open() -> None:
    table = render({"HeteroFlow": [HF]}, SIZES)
    cpu_row = row(table, "control-plane CPU per trivial job")
    assert cpu_row[1] == "not run" and cpu_row[2] == "146 ms"
    assert cpu_row[3] == "–" and cpu_row[4] == "≤ 30 ms: not met"  # needs no Slurm
    assert row(table, "same: jobs completed per second")[4] == "ratio ≥ 1.0: –"


def test_failed_run_is_a_dash_not_a_zero() -> None:
    by_key = {m.key: m for m in metrics(SIZES)}
    assert ratio(by_key["burst_jobs_per_s"], math.nan, 18.3) == "–"
    assert verdict(by_key["wide_all_running_s"], math.nan, 1.2) == "≤ 2 s: –"
    table = render({"Slurm": [SLURM], "HeteroFlow": [{}]}, SIZES)
    assert row(table, "500 trivial")[2] == "– s"


@pytest.mark.parametrize(
    ("missing", "root", "only", "expected"),
    [
        ([], True, None, ["Slurm", "HeteroFlow"]),
        (["slurmctld"], True, None, ["HeteroFlow"]),
        ([], False, None, ["HeteroFlow"]),
        ([], True, "heteroflow", ["HeteroFlow"]),
        ([], True, "slurm", ["Slurm"]),
    ],
    ids=["both", "no-slurm", "not-root", "only-heteroflow", "only-slurm"],
)
def test_systems_to_run(
    monkeypatch: pytest.MonkeyPatch,
    missing: list[str],
    root: bool,
    only: str | None,
    expected: list[str],
) -> None:
    monkeypatch.setattr(peer, "slurm_missing", lambda: missing)
    monkeypatch.setattr(os, "geteuid", lambda: 0 if root else 1000)
    names, why = peer.systems_to_run(only)
    assert names == expected
    assert bool(why) is (expected == ["HeteroFlow"] and only is None)
    if missing:
        assert "Slurm is not installed (slurmctld not found)" in why


def test_only_slurm_without_slurm_stops_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peer, "slurm_missing", lambda: ["sbatch"])
    with pytest.raises(SystemExit, match="sbatch not found"):
        peer.systems_to_run("slurm")


BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"


def test_cpu_of_a_reaped_child_counts_in_its_parent() -> None:
    before = cpu.cpu_seconds([os.getpid()])
    subprocess.run([sys.executable, "-c", BURN], check=True)
    used = cpu.delta(before, cpu.cpu_seconds([os.getpid()]))
    assert used.seconds >= 0.25


def test_tree_takes_descendants_and_prunes_below_a_supervisor() -> None:
    code = "import subprocess; subprocess.run(['sleep', '30'])"
    parent = subprocess.Popen([sys.executable, "-c", code, "supervisor.py"])
    try:
        deadline = time.monotonic() + 10
        while not (kids := psutil.Process(parent.pid).children()):
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.05)
        assert {k.pid for k in kids} <= set(cpu.tree([parent.pid]))
        pruned = cpu.tree([parent.pid], prune=lambda cmd: "supervisor.py" in cmd)
        assert pruned == [parent.pid]
    finally:
        for kid in psutil.Process(parent.pid).children():
            kid.kill()
        parent.kill()
        parent.wait()


class StuckSystem:
    """A system whose jobs never end (`stuck`), or end at once but never run (`stuck=0`)."""

    name = "stuck"
    per_job_names: tuple[str, ...] = ()

    def __init__(self, stuck: int) -> None:
        self.stuck = stuck

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def submit(self, command: str) -> None: ...

    async def active(self) -> int:
        return self.stuck

    def control_plane(self) -> list[int]:
        return [os.getpid()]

    def helpers(self) -> list[int]:
        return []


@pytest.mark.parametrize(
    ("stuck", "measured", "failed"),
    [(1, set(), "burst failed (TimeoutError"), (0, {"burst_makespan_s"}, "steady failed")],
    ids=["burst-never-drains", "steady-jobs-never-run"],
)
def test_a_failed_workload_stops_the_run_and_says_why(
    tmp_path: Path, stuck: int, measured: set[str], failed: str
) -> None:
    sizes = Sizes(burst=3, rate=50, steady_s=0.1, wide=2, poll_s=0.02, timeout_s=0.3)
    results, notes = asyncio.run(measure(StuckSystem(stuck), sizes, tmp_path))
    assert measured <= set(results) and not {"steady_p99_ms", "wide_all_running_s"} & set(results)
    failure = next(n for n in notes if "failed" in n)
    assert failure.startswith(failed) and failure.endswith(
        "not run: ['wide']" if stuck == 0 else "not run: ['steady', 'wide']"
    )
    assert notes[-1] == f"jobs still active at the end: {stuck}"


async def test_heteroflow_submit_waits_out_a_throttle_and_sends_again(tmp_path: Path) -> None:
    """A 429 with Retry-After is what a client must wait out, not a failed workload; any
    other refusal still fails it. (httpx's transport stands in for the gateway: pure client
    logic.)"""
    answers = [429, 503, 201, 400]
    seen: list[float] = []

    def gateway(request: httpx.Request) -> httpx.Response:
        seen.append(time.monotonic())
        status = answers.pop(0)
        headers = {"Retry-After": "0.05"} if status in (429, 503) else {}
        return httpx.Response(status, headers=headers, json={"id": "t", "error": "e"})

    system = HeteroFlow(tmp_path)
    system.client = httpx.AsyncClient(
        transport=httpx.MockTransport(gateway), base_url="http://gw/api/v1"
    )
    await system.submit("true")
    assert (system.submitted, system.throttled) == (1, 2)
    assert seen[1] - seen[0] >= 0.05 and seen[2] - seen[1] >= 0.05
    with pytest.raises(RuntimeError, match="400"):
        await system.submit("true")


def test_hygiene_counts_zombies_and_task_directories(tmp_path: Path) -> None:
    from bench.peer import hygiene

    # A parent of its own (this test process has other children, from other tests): it
    # starts a child that ends at once, reaps it when told, then waits to be told to end.
    script = (
        "import subprocess, sys\n"
        "child = subprocess.Popen(['true'])\n"
        "sys.stdin.readline()\n"
        "child.wait()\n"
        "print('reaped', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdin is not None and parent.stdout is not None
    try:
        deadline = time.monotonic() + 10
        while hygiene.zombies_under(parent.pid) == 0:  # ended, not yet waited for
            assert time.monotonic() < deadline, "the child never showed as a zombie"
            time.sleep(0.01)
        assert hygiene.zombies_under(parent.pid) == 1
        parent.stdin.write("reap\n")
        parent.stdin.flush()
        assert parent.stdout.readline().strip() == "reaped"
        assert hygiene.zombies_under(parent.pid) == 0
    finally:
        parent.stdin.write("end\n")
        parent.stdin.close()
        parent.wait(10)
    for name in ("a-0", "b-0", "b-1"):
        (tmp_path / "agents" / "n1" / "tasks" / name).mkdir(parents=True)
    assert hygiene.task_dirs(tmp_path) == 3
