"""`heteroflow up --processes`: every service and the local agent as a child process.

The parent keeps what the one-process mode does first (embedded NATS and PostgreSQL, the
credentials bootstrap), then starts `heteroflow service NAME` for each service of
heteroflow/services.py and `heteroflow agent` with the servers' URLs in their environment,
and supervises them: a child that dies is started again after a backoff (1 s doubling to 30
s, back to 1 s once a child has lived a minute); on shutdown every child gets SIGTERM, and
SIGKILL after a grace period.

Each child serves `/readyz` on a port of its own; the parent says the platform is up once every
child answers 200, and records who runs where in `<home>/processes.json` (name → pid, probe
URL, restarts), rewritten whenever a child starts.

No orphans: a child whose parent has gone stops by itself (`watch_parent`), so a SIGKILL of
the parent does not leave services running against servers that died with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import structlog

log = structlog.get_logger(__name__)

PARENT_PID_ENV = "HETEROFLOW_PARENT_PID"
STOP_GRACE_S = 20.0
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
HEALTHY_AFTER_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        # As uvicorn binds: a dead child's connections in TIME_WAIT do not make it busy.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class Child:
    """One supervised process: what to run and what it is doing now."""

    name: str
    argv: list[str]
    env: dict[str, str]
    probe_port: int
    proc: asyncio.subprocess.Process | None = None
    restarts: int = 0

    @property
    def probe(self) -> str:
        return f"http://127.0.0.1:{self.probe_port}"


def children(env: dict[str, str], services: Sequence[str], agent: bool = True) -> list[Child]:
    """The children of `up --processes`, one per service name in `services` (in start order:
    heteroflow/services.py) and the local agent; `env` carries the URLs and secrets they
    share."""
    cli = [sys.executable, "-m", "heteroflow.cli"]
    out = [Child(name, [*cli, "service", name], env, free_port()) for name in services]
    if agent:
        out.append(Child("agent", [*cli, "agent"], env, free_port()))
    for child in out:
        child.env = child.env | {
            "HETEROFLOW_METRICS_PORT": str(child.probe_port),
            PARENT_PID_ENV: str(os.getpid()),
        }
    return out


class Supervisor:
    def __init__(
        self,
        kids: list[Child],
        state_file: Path,
        *,
        first_backoff_s: float = FIRST_BACKOFF_S,
        max_backoff_s: float = MAX_BACKOFF_S,
        stop_grace_s: float = STOP_GRACE_S,
    ) -> None:
        self.children = kids
        self.state_file = state_file
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self.stop_grace_s = stop_grace_s

    async def run(self, stop: asyncio.Event) -> None:
        """Keep every child running until `stop`; then stop them all."""
        await asyncio.gather(*(self._keep(child, stop) for child in self.children))
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()

    async def wait_ready(self, stop: asyncio.Event, log_every_s: float = 10.0) -> bool:
        """Poll every child's /readyz until all answer 200 (True) or `stop` is set (False)."""
        last_log = time.monotonic()
        async with httpx.AsyncClient(timeout=httpx.Timeout(2.0, connect=1.0)) as client:
            while not stop.is_set():
                waiting = [c.name for c in self.children if not await _ready(client, c)]
                if not waiting:
                    return True
                if time.monotonic() - last_log > log_every_s:
                    log.info("waiting_for_services", services=waiting)
                    last_log = time.monotonic()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.25)
        return False

    async def _keep(self, child: Child, stop: asyncio.Event) -> None:
        delay = self.first_backoff_s
        while not stop.is_set():
            if child.restarts and not _port_free(child.probe_port):
                child.probe_port = free_port()  # someone took it while the child was down
                child.env = child.env | {"HETEROFLOW_METRICS_PORT": str(child.probe_port)}
            started = time.monotonic()
            child.proc = await asyncio.create_subprocess_exec(*child.argv, env=child.env)
            self._write_state()
            log.info("service_process_started", service=child.name, pid=child.proc.pid)
            exited = asyncio.create_task(child.proc.wait())
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not exited.done():
                exited.cancel()
                await terminate(child.proc, self.stop_grace_s)
                log.info("service_process_stopped", service=child.name, rc=child.proc.returncode)
                return
            if time.monotonic() - started > HEALTHY_AFTER_S:
                delay = self.first_backoff_s
            log.warning(
                "service_process_exited",
                service=child.name,
                pid=child.proc.pid,
                rc=child.proc.returncode,
                restart_in_s=delay,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            delay = min(delay * 2, self.max_backoff_s)
            child.restarts += 1

    def _write_state(self) -> None:
        state = {
            c.name: {
                "pid": c.proc.pid if c.proc else None,
                "probe": c.probe,
                "restarts": c.restarts,
            }
            for c in self.children
        }
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.state_file)


async def _ready(client: httpx.AsyncClient, child: Child) -> bool:
    if child.proc is None or child.proc.returncode is not None:
        return False
    try:
        return (await client.get(f"{child.probe}/readyz")).status_code == 200
    except httpx.HTTPError:
        return False


async def terminate(proc: asyncio.subprocess.Process, grace_s: float) -> None:
    """SIGTERM, then SIGKILL if the process is still there after `grace_s`."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), grace_s)
    except TimeoutError:
        log.warning("service_process_killed", pid=proc.pid, after_s=grace_s)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


async def watch_parent(stop: asyncio.Event, interval_s: float = 1.0) -> None:
    """In a child of `up --processes`: set `stop` when the parent is gone (re-parented)."""
    raw = os.environ.get(PARENT_PID_ENV)
    if not raw:
        return
    parent = int(raw)
    while not stop.is_set():
        if os.getppid() != parent:
            log.warning("parent_gone_stopping", parent=parent)
            stop.set()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
