"""Node identities end to end on `heteroflow up` with its embedded servers: a node registered
through the API runs `heteroflow agent` with nothing but its key and a credential-free NATS
URL, and runs work; a key that is not the node's cannot even log in, and the node's key
reads nothing in the API; a node with a one-time join token registers itself."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.wait import wait_until

from . import web
from .cluster import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BIN = Path(sys.executable).parent / "heteroflow"
TIMEOUT = httpx.Timeout(10.0, connect=2.0)


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hf-ident-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    out = log.open("ab")
    return subprocess.Popen([str(BIN), *args], env=env, stdout=out, stderr=subprocess.STDOUT)


def _wait(cond: Callable[[], bool], what: str, log: Path, timeout: float = 60.0) -> None:
    """`wait_until`, an HTTP error counting as not yet; a timeout shows `log`'s end."""

    def holds() -> bool:
        try:
            return cond()
        except httpx.HTTPError:
            return False

    wait_until(holds, timeout, 0.2, lambda: f"{what}\n{log.read_text()[-4000:]}")


STOP_PROMPTLY_S = 15.0


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_a_registered_node_runs_work_with_its_own_key_only(root: Path) -> None:
    port, nats_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETEROFLOW_")} | {
        "HETEROFLOW_HOME": str(root / "home"),
        "HETEROFLOW_PORT": str(port),
        "HETEROFLOW_NATS_PORT": str(nats_port),
        "HETEROFLOW_LOCAL_AGENT": "false",
        "HETEROFLOW_LOG_FORMAT": "json",
    }
    up = _spawn(["up"], env, root / "up.log")
    agents: list[subprocess.Popen[bytes]] = []
    try:
        _wait(lambda: web.get(f"{url}/readyz", timeout=1).status_code == 200, "up", root / "up.log")
        creds = json.loads((root / "home" / "credentials.json").read_text())
        operator = {"Authorization": f"Bearer {creds['operator_token']}"}
        tenant = {"Authorization": f"Bearer {creds['tenant_api_key']}"}
        r = web.post(f"{url}/api/v1/nodes/edge-1/credentials", headers=operator)
        assert r.status_code == 201, r.text
        key = r.json()["agent_token"]
        node_env = env | {
            "HETEROFLOW_NODE_ID": "edge-1",
            "HETEROFLOW_NATS_URL": f"nats://127.0.0.1:{nats_port}",  # no credentials in it
            "HETEROFLOW_RUNTIME": "process",
            "HETEROFLOW_DETECT_NVIDIA": "false",
            "HETEROFLOW_STATE_DIR": str(root / "edge-1"),
        }
        # Another node's name with this key: the embedded server refuses the login.
        impostor = _spawn(
            ["agent"],
            node_env | {"HETEROFLOW_NODE_ID": "edge-2", "HETEROFLOW_AGENT_TOKEN": key},
            root / "impostor.log",
        )
        agents.append(impostor)
        agents.append(
            _spawn(["agent"], node_env | {"HETEROFLOW_AGENT_TOKEN": key}, root / "agent.log")
        )

        def online() -> list[str]:
            nodes = web.get(f"{url}/api/v1/nodes", headers=operator).json()["nodes"]
            return [n["id"] for n in nodes if n["status"] == "online"]

        _wait(lambda: "edge-1" in online(), "edge-1 online", root / "agent.log")
        body = {"name": "on-edge", "command": "echo from-edge", "requested_node_id": "edge-1"}
        r = web.post(f"{url}/api/v1/tasks", json=body, headers=tenant)
        assert r.status_code == 201, r.text
        tid = r.json()["id"]

        def task() -> dict[str, object]:
            return dict(web.get(f"{url}/api/v1/tasks/{tid}", headers=tenant).json())

        _wait(lambda: task()["status"] == "completed", "the task on edge-1", root / "agent.log")
        assert task()["node_id"] == "edge-1"
        assert "edge-2" not in online()
        nats_log = (root / "home" / "nats" / "nats.log").read_text()
        assert 'authentication error - User "agent-edge-2"' in nats_log
        # In the API the key reads nothing, not even the task its node ran.
        agent = {"Authorization": f"Bearer {key}"}
        assert web.get(f"{url}/api/v1/tasks/{tid}", headers=agent).status_code == 403
        # A node may also register itself with a one-time join token from the operator.
        r = web.post(f"{url}/api/v1/nodes/join-tokens", headers=operator)
        assert r.status_code == 201, r.text
        joiner = node_env | {
            "HETEROFLOW_NODE_ID": "edge-3",
            "HETEROFLOW_JOIN_TOKEN": r.json()["join_token"],
            "HETEROFLOW_SERVER": url,
            "HETEROFLOW_STATE_DIR": str(root / "edge-3"),
        }
        agents.append(_spawn(["agent"], joiner, root / "joiner.log"))
        _wait(lambda: "edge-3" in online(), "edge-3 joined and online", root / "joiner.log")
        assert (root / "edge-3" / "agent_token").stat().st_mode & 0o777 == 0o600
        # Told to stop, the agent whose login is refused stops at once (it retried its
        # first connect, and its stop waited for that minute to end).
        impostor.send_signal(signal.SIGTERM)
        impostor.wait(STOP_PROMPTLY_S)
    finally:
        for proc in agents:
            _stop(proc)
        _stop(up)
