"""`heteroflow up` as a user runs it: embedded servers, credentials, a task, restart."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.wait import wait_until

from . import web
from .cluster import remove_installation

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Every HTTP call says how long it may wait. A platform that answers a read in more than
# READ_TIMEOUT_S is broken, not slow; starting embedded servers is allowed longer.
READ_TIMEOUT = httpx.Timeout(10.0, connect=2.0)
READY_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 40.0
STOP_TIMEOUT_S = 60.0


def _start(home: Path, port: int) -> subprocess.Popen[bytes]:
    """`heteroflow up` with its output in a file: a pipe nobody reads fills up (64 KiB) and
    then blocks the platform on its next log line, which looks exactly like a stalled API."""
    env = os.environ | {
        "HETEROFLOW_HOME": str(home),
        "HETEROFLOW_PORT": str(port),
        "HETEROFLOW_NATS_PORT": str(_free_port()),
    }
    env.pop("HETEROFLOW_NATS_URL", None)
    env.pop("HETEROFLOW_DATABASE_URL", None)
    exe = Path(sys.executable).parent / "heteroflow"
    home.mkdir(parents=True, exist_ok=True)
    out = (home.parent / "up.log").open("ab")
    return subprocess.Popen([str(exe), "up"], env=env, stdout=out, stderr=subprocess.STDOUT)


def _output(home: Path) -> str:
    path = home.parent / "up.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _wait_ready(url: str, proc: subprocess.Popen[bytes], home: Path) -> None:
    def ready() -> bool:
        assert proc.poll() is None, _output(home)[-3000:]
        try:
            return web.get(f"{url}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(ready, READY_TIMEOUT_S, 0.2, lambda: "platform ready:\n" + _output(home)[-3000:])


def _stop(proc: subprocess.Popen[bytes], home: Path) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stacks = _stacks(proc.pid)
        proc.kill()
        proc.wait()
        raise AssertionError(
            f"`up` still running {STOP_TIMEOUT_S:g} s after SIGTERM; its threads:\n{stacks}\n"
            f"its log:\n{_output(home)[-4000:]}"
        ) from None
    out = _output(home)
    assert proc.returncode == 0, out[-3000:]
    return out


def _stacks(pid: int) -> str:
    """Where a process is stuck, from py-spy (a test dependency) when it can read it."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    try:
        done = subprocess.run(
            [spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(no stacks: {exc!r})"
    return (done.stdout + done.stderr)[-6000:]


def _client(url: str, key: str) -> httpx.Client:
    return httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=READ_TIMEOUT
    )


@pytest.fixture
def home() -> Iterator[Path]:
    # Not tmp_path: pytest prunes old base dirs under a running server of another session.
    root = Path(tempfile.mkdtemp(prefix="hf-up-"))
    yield root / "home"
    remove_installation(root / "home")  # the local agent keeps exited containers
    shutil.rmtree(root, ignore_errors=True)


def test_up_creates_credentials_serves_tasks_and_survives_restart(home: Path) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start(home, port)
    try:
        _wait_ready(url, proc, home)
        creds_file = home / "credentials.json"
        assert creds_file.stat().st_mode & 0o777 == 0o600
        creds = json.loads(creds_file.read_text())
        assert {"operator_token", "agent_token", "tenant_api_key", "url"} <= creds.keys()
        assert creds["url"] == url
        with _client(url, creds["tenant_api_key"]) as api:
            r = api.post(
                "/api/v1/tasks",
                json={"name": "hello", "image": "busybox:latest", "command": "echo hi"},
            )
            assert r.status_code == 201, r.text
            task_id = r.json()["id"]
            listed = api.get("/api/v1/tasks").json()
            assert [t["id"] for t in listed["tasks"]] == [task_id]
            # The local agent runs it (docker when an engine answers, else a process).
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while api.get(f"/api/v1/tasks/{task_id}").json()["status"] != "completed":
                assert time.monotonic() < deadline, "the local agent did not run the task"
                time.sleep(0.3)
            assert api.get(f"/api/v1/tasks/{task_id}/logs").json()["logs"] == ["hi"]
            metrics = api.get("/metrics").text
        for name in (
            "heteroflow_events_appended_total",
            "heteroflow_relay_lag_events",
            "heteroflow_schedule_attempts_total",
            "heteroflow_scheduling_round_seconds",
            "heteroflow_consumer_redeliveries_total",
            "heteroflow_nodes",
            "heteroflow_gpus",
            "heteroflow_pending_tasks",
            "heteroflow_event_loop_lag_seconds",
        ):
            assert name in metrics, name
    finally:
        out = _stop(proc, home)
    assert "credentials.json" in out and "curl" in out

    proc = _start(home, port)
    try:
        _wait_ready(url, proc, home)
        again = json.loads((home / "credentials.json").read_text())
        assert again["tenant_api_key"] == creds["tenant_api_key"]
        with _client(url, again["tenant_api_key"]) as api:
            got = api.get(f"/api/v1/tasks/{task_id}")
            assert got.status_code == 200 and got.json()["name"] == "hello"
        with _client(url, again["operator_token"]) as op:
            assert op.get("/api/v1/tenants").status_code == 200
    finally:
        _stop(proc, home)


POLL_INTERVAL_S = 0.1
POLL_LIMIT_S = 1.0
BURST = 50
BURST_TIMEOUT_S = 180.0


def test_api_answers_within_a_second_while_the_local_agent_runs_fifty_tasks(home: Path) -> None:
    """The API shares `heteroflow up`'s event loop with the scheduler, the relay and the local
    agent: a blocking call in any of them stalls every request. Poll a task every 100 ms
    while 50 tasks run through the local agent; no poll may take a second."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start(home, port)
    try:
        _wait_ready(url, proc, home)
        creds = json.loads((home / "credentials.json").read_text())
        with _client(url, creds["tenant_api_key"]) as api:
            ids = []
            for i in range(BURST):
                r = api.post(
                    "/api/v1/tasks",
                    json={"name": f"burst-{i}", "image": "busybox:latest", "command": "echo hi"},
                )
                assert r.status_code == 201, r.text
                ids.append(r.json()["id"])
            polls: list[tuple[float, str]] = []
            status: dict[str, str] = {}
            deadline = time.monotonic() + BURST_TIMEOUT_S
            while len([s for s in status.values() if s == "completed"]) < BURST:
                assert time.monotonic() < deadline, f"not all tasks completed: {status}"
                for task_id in ids:  # one poll per tick, round robin over unfinished tasks
                    if status.get(task_id) == "completed":
                        continue
                    started = time.monotonic()
                    r = api.get(f"/api/v1/tasks/{task_id}")
                    polls.append((time.monotonic() - started, task_id))
                    assert r.status_code == 200, r.text
                    status[task_id] = r.json()["status"]
                    assert status[task_id] not in ("failed", "cancelled"), r.json()
                    time.sleep(POLL_INTERVAL_S)
                    break
    finally:
        out = _stop(proc, home)
    slowest = max(polls)
    stalls = [line for line in out.splitlines() if "event_loop_stalled" in line]
    assert slowest[0] < POLL_LIMIT_S, (
        f"a poll took {slowest[0]:.2f} s ({slowest[1]}); stalls logged:\n" + "\n".join(stalls)
    )
    assert len(polls) > 20
