"""The process supervisor of `heteroflow up --processes`, with real (tiny) child processes:
a child that dies is started again; on stop every child gets SIGTERM, and SIGKILL if it
ignores it; the state file says who runs; a child whose parent is gone stops itself."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from heteroflow.processes import PARENT_PID_ENV, Child, Supervisor, watch_parent
from tests.wait import wait_until_async


def child(name: str, code: str) -> Child:
    return Child(name, [sys.executable, "-c", code], {}, probe_port=0)


async def test_a_dying_child_is_restarted_and_stop_ends_every_child(tmp_path: Path) -> None:
    state = tmp_path / "processes.json"
    dies = child("dies", "import sys; sys.exit(3)")
    sleeps = child("sleeps", "import time; time.sleep(60)")
    sup = Supervisor([dies, sleeps], state, first_backoff_s=0.05, stop_grace_s=5)
    stop = asyncio.Event()
    running = asyncio.create_task(sup.run(stop))

    await wait_until_async(lambda: dies.restarts >= 2, 10.0, 0.05)
    await wait_until_async(
        lambda: state.exists() and json.loads(state.read_text())["dies"]["restarts"], 10.0, 0.05
    )
    assert sleeps.proc is not None and sleeps.restarts == 0
    assert json.loads(state.read_text())["sleeps"]["pid"] == sleeps.proc.pid

    stop.set()
    await asyncio.wait_for(running, 10)
    assert sleeps.proc is not None and sleeps.proc.returncode == -15  # SIGTERM
    assert not state.exists()


async def test_a_child_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    stubborn = child(
        "stubborn",
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        " print('ready', flush=True); time.sleep(60)",
    )
    sup = Supervisor([stubborn], tmp_path / "processes.json", stop_grace_s=0.5)
    stop = asyncio.Event()
    running = asyncio.create_task(sup.run(stop))
    await wait_until_async(lambda: stubborn.proc is not None, 10.0, 0.05)
    await asyncio.sleep(0.5)  # let it install its handler; the kill is what is measured
    stop.set()
    await asyncio.wait_for(running, 10)
    assert stubborn.proc is not None and stubborn.proc.returncode == -9  # SIGKILL


@pytest.mark.parametrize(
    ("recorded_parent", "stops"),
    [(os.getppid(), False), (os.getpid(), True)],  # our own pid: the parent we had is gone
    ids=["parent-alive", "parent-gone"],
)
async def test_watch_parent(
    monkeypatch: pytest.MonkeyPatch, recorded_parent: int, stops: bool
) -> None:
    monkeypatch.setenv(PARENT_PID_ENV, str(recorded_parent))
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch_parent(stop, interval_s=0.05))
    await asyncio.sleep(0.3)
    assert stop.is_set() is stops
    stop.set()
    await asyncio.wait_for(watcher, 2)
