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

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(home: Path, port: int) -> subprocess.Popen[bytes]:
    env = os.environ | {
        "HETEROFLOW_HOME": str(home),
        "HETEROFLOW_PORT": str(port),
        "HETEROFLOW_NATS_PORT": str(_free_port()),
    }
    env.pop("HETEROFLOW_NATS_URL", None)
    env.pop("HETEROFLOW_DATABASE_URL", None)
    exe = Path(sys.executable).parent / "heteroflow"
    return subprocess.Popen(
        [str(exe), "up"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("platform did not become ready")


def _stop(proc: subprocess.Popen[bytes]) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out.decode()[-3000:]
    return out.decode()


@pytest.fixture
def home() -> Iterator[Path]:
    # Not tmp_path: pytest prunes old base dirs under a running server of another session.
    root = Path(tempfile.mkdtemp(prefix="hf-up-"))
    yield root / "home"
    shutil.rmtree(root, ignore_errors=True)


def test_up_creates_credentials_serves_tasks_and_survives_restart(home: Path) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start(home, port)
    try:
        _wait_ready(url, proc)
        creds_file = home / "credentials.json"
        assert creds_file.stat().st_mode & 0o777 == 0o600
        creds = json.loads(creds_file.read_text())
        assert {"operator_token", "agent_token", "tenant_api_key", "url"} <= creds.keys()
        assert creds["url"] == url
        headers = {"Authorization": f"Bearer {creds['tenant_api_key']}"}
        r = httpx.post(
            f"{url}/api/v1/tasks",
            headers=headers,
            json={"name": "hello", "image": "busybox:latest", "command": "echo hi"},
        )
        assert r.status_code == 201, r.text
        task_id = r.json()["id"]
        listed = httpx.get(f"{url}/api/v1/tasks", headers=headers).json()
        assert [t["id"] for t in listed["tasks"]] == [task_id]
        # The local agent runs it (docker when an engine answers, else a process).
        deadline = time.monotonic() + 40
        while (
            httpx.get(f"{url}/api/v1/tasks/{task_id}", headers=headers).json()["status"]
            != "completed"
        ):
            assert time.monotonic() < deadline, "the local agent did not run the task"
            time.sleep(0.3)
        logs = httpx.get(f"{url}/api/v1/tasks/{task_id}/logs", headers=headers).json()
        assert logs["logs"] == ["hi"]
        metrics = httpx.get(f"{url}/metrics").text
        for name in (
            "heteroflow_events_appended_total",
            "heteroflow_relay_lag_events",
            "heteroflow_schedule_attempts_total",
            "heteroflow_scheduling_round_seconds",
            "heteroflow_consumer_redeliveries_total",
            "heteroflow_nodes",
            "heteroflow_gpus",
            "heteroflow_pending_tasks",
        ):
            assert name in metrics, name
    finally:
        out = _stop(proc)
    assert "credentials.json" in out and "curl" in out

    proc = _start(home, port)
    try:
        _wait_ready(url, proc)
        again = json.loads((home / "credentials.json").read_text())
        assert again["tenant_api_key"] == creds["tenant_api_key"]
        headers = {"Authorization": f"Bearer {again['tenant_api_key']}"}
        got = httpx.get(f"{url}/api/v1/tasks/{task_id}", headers=headers)
        assert got.status_code == 200 and got.json()["name"] == "hello"
        op = {"Authorization": f"Bearer {again['operator_token']}"}
        assert httpx.get(f"{url}/api/v1/tenants", headers=op).status_code == 200
    finally:
        _stop(proc)
