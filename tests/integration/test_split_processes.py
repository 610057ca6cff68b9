"""The split mode: `heteroflow up --processes` runs each service of heteroflow/services.py
and the local agent as separate processes. A task created over
HTTP runs to completion in a real container; a scheduler killed with SIGKILL while work is in
flight is replaced by the supervisor, and every task still completes exactly once."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import pytest

from heteroflow.services import names
from libs.embedded import EmbeddedNats
from tests.wait import wait_until

from . import web
from .cluster import free_port
from .conftest import requires_docker

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.docker, requires_docker]

CHILDREN = {*names(), "agent"}
HAPPY_PATH = ["pending", "scheduled", "starting", "running", "completed"]
# A report the killed scheduler had fetched but not acknowledged comes back only after the
# consumer's ack wait; the new scheduler may meanwhile apply the next report of the same task
# (`running` while the task is still `scheduled`, a reconciliation the whitelist allows). The
# task then skips `starting` in its history, and still ran once: one placement, one run.
SKIPPED_STARTING = ["pending", "scheduled", "running", "completed"]
TIMEOUT = httpx.Timeout(10.0, connect=2.0)


@dataclass
class Split:
    """`heteroflow up --processes` in a session (process group) of its own."""

    root: Path
    database_url: str
    node_id: str
    proc: subprocess.Popen[bytes]
    url: str

    @property
    def home(self) -> Path:
        return self.root / "home"

    def output(self) -> str:
        path = self.root / "up.log"
        return path.read_text(errors="replace")[-8000:] if path.exists() else ""

    def wait(self, cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
        def alive_and_holds() -> bool:
            assert self.proc.poll() is None, f"platform exited\n{self.output()}"
            return cond()

        wait_until(alive_and_holds, timeout, 0.2, lambda: f"{what}\n{self.output()}")

    def children(self) -> dict[str, dict[str, Any]]:
        path = self.home / "processes.json"
        try:
            return dict(json.loads(path.read_text()))
        except (FileNotFoundError, ValueError):
            return {}

    def ready(self, probe: str) -> bool:
        try:
            return web.get(f"{probe}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def all_ready(self) -> bool:
        kids = self.children()
        return set(kids) == CHILDREN and all(self.ready(k["probe"]) for k in kids.values())

    def api(self) -> httpx.Client:
        key = json.loads((self.home / "credentials.json").read_text())["tenant_api_key"]
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=TIMEOUT
        )

    def history(self, task_id: str) -> list[str]:
        """The task's status history, from its event stream in the store."""
        with psycopg.connect(self.database_url) as conn:
            rows = conn.execute(
                "SELECT type, payload FROM events WHERE stream_id = %s ORDER BY version",
                (task_id,),
            ).fetchall()
        return [
            "pending" if kind == "task_created" else payload["to_status"]
            for kind, payload in rows
            if kind in ("task_created", "task_status_changed")
        ]


@pytest.fixture
def split(database_url: str) -> Iterator[Split]:
    root = Path(tempfile.mkdtemp(prefix="hf-split-"))
    nats = EmbeddedNats(root / "nats").start()  # its own: durable consumers are per stream
    port = free_port()
    node_id = f"split-{uuid.uuid4().hex[:8]}"  # adopts no container of another test
    env = os.environ | {
        "HETEROFLOW_HOME": str(root / "home"),
        "HETEROFLOW_PORT": str(port),
        "HETEROFLOW_NATS_URL": nats.url,
        "HETEROFLOW_DATABASE_URL": database_url,
        "HETEROFLOW_NODE_ID": node_id,
        "HETEROFLOW_RUNTIME": "docker",
        "HETEROFLOW_DETECT_NVIDIA": "false",
        "HETEROFLOW_HEARTBEAT_INTERVAL_S": "0.5",
        "HETEROFLOW_LOG_FORMAT": "json",
    }
    out = (root / "up.log").open("ab")
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "heteroflow"), "up", "--processes"],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # one process group: nothing of it may outlive the test
    )
    s = Split(root, database_url, node_id, proc, f"http://127.0.0.1:{port}")
    try:
        yield s
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        out.close()
        _remove_containers(node_id)
        nats.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_split_processes_run_a_task_and_survive_a_killed_scheduler(split: Split) -> None:
    split.wait(split.all_ready, "every child process ready", timeout=60)
    kids = split.children()
    pids = {name: kid["pid"] for name, kid in kids.items()}
    assert len(set(pids.values())) == len(CHILDREN) and split.proc.pid not in pids.values()
    for name, pid in pids.items():
        cmdline = psutil.Process(pid).cmdline()
        assert cmdline[-1] == ("agent" if name == "agent" else name), cmdline
        assert psutil.Process(pid).ppid() == split.proc.pid

    with split.api() as api:
        split.wait(lambda: _node_online(split), f"node {split.node_id} online")
        first = _create(api, "echo hello")
        split.wait(lambda: _status(api, first) == "completed", "the first task completes")
        assert api.get(f"/api/v1/tasks/{first}/logs").json()["logs"] == ["hello"]

        # Work in flight: running containers, and tasks the dead scheduler never saw.
        sleepers = [_create(api, f"sleep 3; echo done-{i}") for i in range(3)]
        split.wait(lambda: any(_status(api, t) == "running" for t in sleepers), "a sleeper running")
        os.kill(pids["scheduler"], signal.SIGKILL)
        late = [_create(api, f"echo late-{i}") for i in range(3)]

        def replaced() -> bool:
            now = split.children().get("scheduler", {})
            return now.get("pid") not in (None, pids["scheduler"]) and split.ready(now["probe"])

        split.wait(replaced, "a new scheduler process, ready", timeout=30)
        assert split.children()["scheduler"]["restarts"] == 1
        tasks = [first, *sleepers, *late]
        split.wait(
            lambda: all(_status(api, t) == "completed" for t in tasks),
            "every task completed",
            timeout=45,
        )
        for i, task_id in enumerate(sleepers):
            assert api.get(f"/api/v1/tasks/{task_id}/logs").json()["logs"] == [f"done-{i}"]
        views = {t: api.get(f"/api/v1/tasks/{t}").json() for t in tasks}

    for task_id in tasks:  # exactly once: one placement, one run, one completion
        assert split.history(task_id) in (HAPPY_PATH, SKIPPED_STARTING), task_id
        assert views[task_id]["retry_count"] == 0
        assert _containers(task_id) == 1, task_id

    # Shutdown: SIGTERM to the parent stops every child; nothing of the group remains.
    split.proc.send_signal(signal.SIGTERM)
    assert split.proc.wait(60) == 0, split.output()
    pid = split.proc.pid
    wait_until(lambda: not _group_alive(pid), 10, 0.2, "every child of `up --processes` ended")
    assert not (split.home / "processes.json").exists()


def _create(api: httpx.Client, command: str) -> str:
    r = api.post(
        "/api/v1/tasks", json={"name": "split", "image": "busybox:latest", "command": command}
    )
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _status(api: httpx.Client, task_id: str) -> str:
    return str(api.get(f"/api/v1/tasks/{task_id}").json()["status"])


def _node_online(split: Split) -> bool:
    op = json.loads((split.home / "credentials.json").read_text())["operator_token"]
    r = web.get(
        f"{split.url}/api/v1/nodes", headers={"Authorization": f"Bearer {op}"}, timeout=TIMEOUT
    )
    return any(n["id"] == split.node_id and n["status"] == "online" for n in r.json()["nodes"])


def _group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process of the group remains."""
    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
    return False


def _docker() -> Any:
    import docker

    return docker.from_env(timeout=10)


def _containers(task_id: str) -> int:
    found = _docker().containers.list(all=True, filters={"label": f"heteroflow.task_id={task_id}"})
    return len(found)


def _remove_containers(node_id: str) -> None:
    for c in _docker().containers.list(all=True, filters={"label": f"heteroflow.node={node_id}"}):
        c.remove(force=True)
