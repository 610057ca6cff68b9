"""The agent's daemon thread pool: results and errors come back, the bound holds, and a
call still blocked does not hold the process's exit up (ThreadPoolExecutor's threads do)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from functools import partial

import pytest

from agent.runtimes.daemon_threads import DaemonThreads


def test_results_and_errors_come_back() -> None:
    pool = DaemonThreads(2, "t")
    assert pool.submit(lambda: 41 + 1).result(5) == 42

    def boom() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        pool.submit(boom).result(5)
    pool.shutdown()


def test_no_more_threads_than_the_bound_and_every_call_runs() -> None:
    pool = DaemonThreads(3, "bound")
    gate = threading.Event()
    running: list[int] = []
    most = 0
    lock = threading.Lock()

    def call(i: int) -> int:
        nonlocal most
        with lock:
            running.append(i)
            most = max(most, len(running))
        gate.wait(5)
        with lock:
            running.remove(i)
        return i

    futures = [pool.submit(partial(call, i)) for i in range(10)]
    deadline = time.monotonic() + 5
    while len(running) < 3:  # the first three start at once
        assert time.monotonic() < deadline, running
        time.sleep(0.01)
    gate.set()
    assert sorted(f.result(5) for f in futures) == list(range(10))
    assert most == 3
    assert sum(t.name.startswith("bound-") for t in threading.enumerate()) <= 3
    pool.shutdown()


@pytest.mark.parametrize("kind", ["daemon", "executor"])
def test_a_blocked_call_holds_the_exit_up_only_in_an_executor(kind: str) -> None:
    pool = (
        "from agent.runtimes.daemon_threads import DaemonThreads; p = DaemonThreads(1, 'x'); "
        "p.submit(lambda: time.sleep(20))"
        if kind == "daemon"
        else "from concurrent.futures import ThreadPoolExecutor; "
        "p = ThreadPoolExecutor(1); p.submit(time.sleep, 20)"
    )
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", f"import time; {pool}; time.sleep(0.2)"])
    try:
        proc.wait(3)  # the daemon's exits in a fraction of that; the executor's never does
        exited = True
    except subprocess.TimeoutExpired:
        exited = False
    finally:
        proc.kill()
        proc.wait()
    assert exited is (kind == "daemon"), time.monotonic() - started
