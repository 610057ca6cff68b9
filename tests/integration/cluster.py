"""A real platform for end-to-end tests: `heteroflow up` (control plane) and `heteroflow agent`
processes over a NATS server of their own and a fresh PostgreSQL database."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from libs.embedded import EmbeddedNats
from tests.wait import wait_until

from . import web

BIN = Path(sys.executable).parent / "heteroflow"
TERMINAL = {"completed", "failed", "cancelled", "stopped"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TenantCalls:
    """The tenant's group and log calls of the e2e tests, on any platform under test that
    has a `url` and the tenant's `tenant` headers (a Cluster, `up --processes`)."""

    url: str

    @property
    def tenant(self) -> dict[str, str]:
        raise NotImplementedError

    def create_group(self, **body: Any) -> dict[str, Any]:
        r = web.post(f"{self.url}/api/v1/task-groups", json=body, headers=self.tenant)
        assert r.status_code == 201, r.text
        return dict(r.json())

    def group(self, group_id: str) -> dict[str, Any]:
        r = web.get(f"{self.url}/api/v1/task-groups/{group_id}", headers=self.tenant)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def logs(self, task_id: str) -> list[str]:
        r = web.get(f"{self.url}/api/v1/tasks/{task_id}/logs", headers=self.tenant)
        assert r.status_code == 200, r.text
        return list(r.json()["logs"])


@dataclass
class Cluster(TenantCalls):
    root: Path
    database_url: str
    nats: EmbeddedNats
    env: dict[str, str] = field(default_factory=dict)
    control: subprocess.Popen[bytes] | None = None
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    url: str = ""
    creds: dict[str, str] = field(default_factory=dict)
    node_keys: dict[str, str] = field(default_factory=dict)
    # Run in the `up` child before it starts (e.g. a lower open-files limit).
    preexec: Callable[[], None] | None = None

    def start(self, **extra_env: str) -> Cluster:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.env = (
            os.environ
            | {
                "HETEROFLOW_HOME": str(self.root / "home"),
                "HETEROFLOW_PORT": str(port),
                "HETEROFLOW_NATS_URL": self.nats.url,
                "HETEROFLOW_DATABASE_URL": self.database_url,
                "HETEROFLOW_LOCAL_AGENT": "false",
                "HETEROFLOW_NODE_OFFLINE_AFTER_S": "3",
                "HETEROFLOW_LOG_FORMAT": "json",
            }
            | extra_env
        )
        log = open(self.root / "control.log", "ab")  # noqa: SIM115 - the child owns it
        self.control = subprocess.Popen(
            [str(BIN), "up"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=self.preexec,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.control.poll() is None, self.log("control")
            try:
                if web.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.creds = json.loads((self.root / "home" / "credentials.json").read_text())
        return self

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text()[-6000:] if path.exists() else ""

    def register(self, node_id: str) -> str:
        """The node's agent key, as an operator registers a node."""
        if node_id not in self.node_keys:
            r = web.post(f"{self.url}/api/v1/nodes/{node_id}/credentials", headers=self.operator)
            assert r.status_code == 201, r.text
            self.node_keys[node_id] = r.json()["agent_token"]
        return self.node_keys[node_id]

    def start_agent(self, node_id: str, runtime: str = "process", **extra_env: str) -> None:
        env = (
            self.env
            | {
                "HETEROFLOW_NODE_ID": node_id,
                "HETEROFLOW_AGENT_TOKEN": self.register(node_id),
                "HETEROFLOW_RUNTIME": runtime,
                "HETEROFLOW_DETECT_NVIDIA": "false",
                "HETEROFLOW_HEARTBEAT_INTERVAL_S": "0.5",
                "HETEROFLOW_STATE_DIR": str(self.root / "agents" / node_id),
            }
            | extra_env
        )
        log = open(self.root / f"agent-{node_id}.log", "ab")  # noqa: SIM115
        self.agents[node_id] = subprocess.Popen(
            [str(BIN), "agent"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        self.wait(
            lambda: any(n["id"] == node_id and n["status"] == "online" for n in self.nodes()),
            f"node {node_id} online",
        )

    def kill_agent(self, node_id: str) -> None:
        proc = self.agents.pop(node_id)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def nodes(self) -> list[dict[str, Any]]:
        r = web.get(f"{self.url}/api/v1/nodes", headers=self.operator)
        return list(r.json()["nodes"])

    @property
    def tenant(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.creds['tenant_api_key']}"}

    @property
    def operator(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.creds['operator_token']}"}

    def agent_key(self, node_id: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.register(node_id)}"}

    def create(self, **body: Any) -> dict[str, Any]:
        body = {"name": "t", "image": "busybox:latest"} | body
        r = web.post(f"{self.url}/api/v1/tasks", json=body, headers=self.tenant)
        assert r.status_code == 201, r.text
        return dict(r.json())

    def task(self, task_id: str) -> dict[str, Any]:
        r = web.get(f"{self.url}/api/v1/tasks/{task_id}", headers=self.tenant)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def wait(self, cond: Callable[[], bool], what: str, timeout: float = 30.0) -> float:
        """Poll `cond` until it holds (the seconds it took); a timeout shows the control log."""
        started = time.monotonic()
        wait_until(cond, timeout, 0.1, lambda: f"{what}\n--- control\n{self.log('control')}")
        return time.monotonic() - started

    def wait_status(self, task_id: str, *statuses: str, timeout: float = 30.0) -> dict[str, Any]:
        self.wait(
            lambda: self.task(task_id)["status"] in statuses,
            f"{task_id} in {statuses} (now {self.task(task_id)['status']})",
            timeout,
        )
        return self.task(task_id)

    def statuses(self, task_id: str) -> list[str]:
        """The task's status history, from its event stream in the store."""
        import psycopg

        with psycopg.connect(self.database_url) as conn:
            rows = conn.execute(
                "SELECT type, payload FROM events WHERE stream_id = %s ORDER BY version",
                (task_id,),
            ).fetchall()
        out = []
        for kind, payload in rows:
            if kind == "task_created":
                out.append("pending")
            elif kind == "task_status_changed":
                out.append(payload["to_status"])
        return out

    def history(self, task_id: str) -> str:
        """The task's transitions with who made them and why, one a line: for a failure's
        message, so a CI log says what happened instead of only that it did."""
        import psycopg

        with psycopg.connect(self.database_url) as conn:
            rows = conn.execute(
                "SELECT version, type, payload, metadata FROM events WHERE stream_id = %s"
                " ORDER BY version",
                (task_id,),
            ).fetchall()
        keys = ("from_status", "to_status", "actor", "reason_code", "reason", "error", "node_id")
        lines = []
        for version, kind, payload, meta in rows:
            fields = {k: payload.get(k) for k in keys if payload.get(k)}
            lines.append(f"{version} {kind} {fields} {meta or {}}")
        return "\n".join(lines)

    def stop(self) -> None:
        stopping = [self.agents.pop(node_id) for node_id in list(self.agents)]
        for proc in stopping:  # all told at once, then waited for
            proc.send_signal(signal.SIGTERM)
        for proc in stopping:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.control:
            self.control.send_signal(signal.SIGTERM)
            try:
                self.control.wait(30)
            except subprocess.TimeoutExpired:
                self.control.kill()
        self._reap()

    def _reap(self) -> None:
        """Work outlives its agent by design; a test's leftovers must not outlive the test."""
        import psutil

        for proc in psutil.process_iter(["cmdline"]):
            if any(str(self.root) in part for part in (proc.info["cmdline"] or [])):
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        # The process tasks' cgroups, which their killed supervisors could not remove.
        from agent.runtimes.cgroups import remove as remove_cgroups

        for state in self.root.glob("agents/*/tasks/*/state.json"):
            with contextlib.suppress(OSError, ValueError):
                cgroup = json.loads(state.read_text()).get("cgroup") or {}
                remove_cgroups(list(cgroup.get("dirs") or []))
        try:
            import docker

            client = docker.from_env(timeout=5)
            import psycopg

            with psycopg.connect(self.database_url) as conn:
                ids = {r[0] for r in conn.execute("SELECT id FROM tasks").fetchall()}
            # The low-level list: `containers.list` inspects each container it lists and
            # fails on one that another test removed meanwhile (the engine is shared), which
            # skipped this whole cleanup and left this test's containers behind.
            # This platform's installation: its networks go even when no container of it is
            # left (a test that removed its container itself left the bridge behind, and the
            # engine's address pools ran out a few dozen tests later).
            mine = self.root / "home" / "installation_id"
            installations = {mine.read_text().strip()} if mine.exists() else set()
            doomed: list[str] = []
            for c in client.api.containers(all=True, filters={"label": "heteroflow.managed"}):
                labels = c.get("Labels") or {}
                if labels.get("heteroflow.task_id") in ids or (
                    labels.get("heteroflow.installation") in installations
                ):
                    installations.add(str(labels.get("heteroflow.installation") or ""))
                    doomed.append(str(c["Id"]))

            def remove(container_id: str) -> None:
                with contextlib.suppress(docker.errors.NotFound):
                    client.api.remove_container(container_id, force=True)

            # Together: a running container takes the engine about a second to kill and
            # remove, and a serving test leaves several.
            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(remove, doomed))
            # Their tenant networks: the engine has room for about 30 bridges.
            from agent.runtimes.networks import prune as prune_networks

            for installation in installations - {""}:
                prune_networks(client, installation, "iptables")
        except Exception:  # noqa: BLE001 - no engine, nothing to clean
            pass


def remove_installation(home: Path) -> None:
    """Every container and tenant network of the installation whose home is `home` (its
    `installation_id`), on this machine's engine; nothing without an engine or an id."""
    mine = home / "installation_id"
    if not mine.exists():
        return
    installation = mine.read_text().strip()
    try:
        import docker

        from agent.runtimes.networks import prune

        client = docker.from_env(timeout=5)
        label = f"heteroflow.installation={installation}"
        for c in client.api.containers(all=True, filters={"label": label}):
            with contextlib.suppress(docker.errors.NotFound):
                client.api.remove_container(c["Id"], force=True)
        prune(client, installation, "iptables")
    except Exception:  # noqa: BLE001 - no engine: nothing was left on one
        pass


def run_async(coro: Any) -> Any:
    return asyncio.new_event_loop().run_until_complete(coro)
