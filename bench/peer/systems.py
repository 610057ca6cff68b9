"""The two systems the peer benchmark drives, behind one small interface.

* `Slurm`: the single-node cluster of `slurm-setup.sh` (64 CPUs, backfill), jobs submitted
  with `sbatch --wrap`, counted with `squeue`. Its control plane is slurmctld and slurmd
  (and slurmctld's helper slurmscriptd); munged is reported beside it, and the per-job
  slurmstepd is not counted (it is not a child of either daemon).
* `HeteroFlow`: `heteroflow up --runtime process --cpus 64` with its embedded NATS and
  PostgreSQL in a temporary home, tasks created over the HTTP API without an image, counted
  with `GET /tasks/stats`. Its control plane is the `up` process and everything it runs
  (NATS, the gateway, the services, the local agent and its per-task supervisors, whose
  reaped time includes the job's own) plus the PostgreSQL processes under its home; the
  jobs' processes themselves are not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol

import httpx

from . import cpu

SETUP = Path(__file__).with_name("slurm-setup.sh")
SLURM_TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo")
READY_TIMEOUT_S = 120.0
MEMORY_MB = 64 * 2048  # 64 tasks of the default size (1 core, 2048 MB) at once


class System(Protocol):
    name: str
    # Processes beside the control plane, reported in the notes, not in the table:
    # long-lived ones by pid (`helpers`), per-job ones by name (sampled while they run).
    per_job_names: tuple[str, ...]

    def helpers(self) -> list[int]: ...

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def submit(self, command: str) -> None: ...
    async def active(self) -> int: ...
    def control_plane(self) -> list[int]: ...


def free_port(pairs: int = 1) -> int:
    """A free TCP port (and, for `pairs=2`, the next one free as well)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if pairs == 1 or _free(port + 1):
            return port
    raise RuntimeError("no free port pair found")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def slurm_missing() -> list[str]:
    """The Slurm and munge programs not on PATH (empty: Slurm can run here)."""
    return [t for t in SLURM_TOOLS if shutil.which(t) is None]


async def _run(*argv: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=cwd,
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {proc.returncode}: {err.decode().strip()}")
    return out.decode()


class Slurm:
    name = "Slurm"
    per_job_names: tuple[str, ...] = ("slurmstepd",)

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = dict(os.environ)

    async def start(self) -> None:
        env = self.env | {"SLURM_PEER_PORT": str(free_port(pairs=2))}
        out = await _run(str(SETUP), "start", str(self.root), env=env)
        conf = next(line for line in out.splitlines() if line.startswith("SLURM_CONF="))
        self.env["SLURM_CONF"] = conf.partition("=")[2]

    async def stop(self) -> None:
        await _run(str(SETUP), "stop", str(self.root), env=self.env)

    async def submit(self, command: str) -> None:
        await _run(
            "sbatch", "--parsable", "--output=/dev/null", "--wrap", command,
            env=self.env, cwd=self.root,
        )  # fmt: skip

    async def active(self) -> int:
        out = await _run("squeue", "-h", "-o", "%i", env=self.env)
        return len(out.split())

    def control_plane(self) -> list[int]:
        roots = [_pid(self.root / "run" / f"{d}.pid") for d in ("slurmctld", "slurmd")]
        return cpu.tree(p for p in roots if p)

    def helpers(self) -> list[int]:
        """munged: Slurm's authentication, reported beside the control plane."""
        pid = _pid(self.root / "run" / "munged.pid")
        return [pid] if pid else []


def _pid(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0


class HeteroFlow:
    name = "HeteroFlow"
    per_job_names: tuple[str, ...] = ()  # its supervisors are reaped by `up`: counted

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.url = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: httpx.AsyncClient | None = None
        self.submitted = 0
        self.throttled = 0  # creates answered 429/503 and sent again

    def _env(self, port: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HETEROFLOW_")}
        # Settings the caller chose for the run (HETEROFLOW_PEER_<NAME>=v → HETEROFLOW_<NAME>).
        for key, value in os.environ.items():
            if key.startswith("HETEROFLOW_PEER_"):
                env["HETEROFLOW_" + key.removeprefix("HETEROFLOW_PEER_")] = value
        return env | {
            "HETEROFLOW_HOME": str(self.home),
            "HETEROFLOW_PORT": str(port),
            "HETEROFLOW_LOG_FORMAT": "json",
        }

    async def start(self) -> None:
        self.proc = self._launch(free_port())
        await self._wait_ready()

    def _launch(self, port: int) -> subprocess.Popen[bytes]:
        self.url = f"http://127.0.0.1:{port}"
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / "up.log", "ab")  # noqa: SIM115 - the child owns it
        argv = [
            str(Path(sys.executable).parent / "heteroflow"), "up",
            "--runtime", "process", "--cpus", "64", "--memory-mb", str(MEMORY_MB),
        ]  # fmt: skip
        return subprocess.Popen(
            argv, env=self._env(port), stdout=log, stderr=subprocess.STDOUT, cwd=self.root
        )

    async def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        creds = self.home / "credentials.json"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"heteroflow up exited {self.proc.returncode}: {self.tail()}")
            if creds.exists() and await self._node_online(json.loads(creds.read_text())):
                return
            await asyncio.sleep(0.2)
        raise RuntimeError(f"heteroflow up not ready in {READY_TIMEOUT_S:g} s: {self.tail()}")

    async def _node_online(self, creds: dict[str, str]) -> bool:
        if self.client is None:
            self.client = httpx.AsyncClient(
                base_url=self.url + "/api/v1",
                headers={"Authorization": f"Bearer {creds['tenant_api_key']}"},
                timeout=30.0,
                limits=httpx.Limits(max_connections=64),
            )
        op = {"Authorization": f"Bearer {creds['operator_token']}"}
        try:
            r = await self.client.get("/nodes", headers=op)
        except httpx.HTTPError:
            return False
        return r.status_code == 200 and any(n["status"] == "online" for n in r.json()["nodes"])

    def tail(self) -> str:
        path = self.root / "up.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.aclose()
            self.client = None
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(self.proc.wait, 60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            await asyncio.to_thread(self.proc.wait, 10)
        self.proc = None  # reaped: its pid may belong to somebody else now
        with contextlib.suppress(Exception):
            for pid in self.control_plane():  # anything under the home the exit left behind
                os.kill(pid, signal.SIGKILL)

    async def submit(self, command: str) -> None:
        """Create one task as a client should: a 429 or 503 is waited out (its
        `Retry-After`) and sent again, and the wait counts in the workload's time."""
        assert self.client is not None
        while True:
            r = await self.client.post("/tasks", json={"name": "peer", "command": command})
            if r.status_code not in (429, 503):
                break
            self.throttled += 1
            await asyncio.sleep(float(r.headers.get("Retry-After", "1")))
        if r.status_code != 201:
            raise RuntimeError(f"create answered {r.status_code}: {r.text}")
        self.submitted += 1

    async def active(self) -> int:
        assert self.client is not None
        r = await self.client.get("/tasks/stats")
        r.raise_for_status()
        by_status: dict[str, int] = r.json()["by_status"]
        done = sum(by_status.get(s, 0) for s in ("completed", "failed", "cancelled", "stopped"))
        return sum(by_status.values()) - done

    def helpers(self) -> list[int]:
        return []

    def control_plane(self) -> list[int]:
        home = str(self.home)
        roots = [self.proc.pid] if self.proc is not None else []
        return cpu.tree(
            roots,
            also=lambda cmd: any(home in part for part in cmd),
            prune=lambda cmd: any(
                part.endswith(("supervisor.py", "supervisor.pyc", "forker.pyc")) for part in cmd
            ),
        )
