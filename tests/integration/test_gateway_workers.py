"""HETEROFLOW_GATEWAY_WORKERS: `heteroflow service api-gateway` with two worker processes on
one port. Both listen, requests are served, a worker killed with SIGKILL is replaced, and
SIGTERM to the parent stops every worker."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import httpx
import psutil
import pytest

from libs import auth
from libs.store.eventstore import EventStore
from tests.wait import wait_until

from . import web
from .cluster import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BODY = {"name": "w", "image": "busybox:latest"}


def workers_of(parent: psutil.Process) -> set[int]:
    """The gateway workers: spawned children (not multiprocessing's resource tracker)."""
    found = set()
    for child in parent.children():
        try:
            cmd = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "spawn_main" in cmd and "resource_tracker" not in cmd and child.is_running():
            found.add(child.pid)
    return found


def answers(url: str) -> bool:
    try:
        return web.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def listens(pid: int, port: int) -> bool:
    conns = psutil.Process(pid).net_connections(kind="tcp")
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns)


@pytest.fixture
def gateway(database_url: str, nats_url: str) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    port, probe = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="hf-gw-") as home:
        env = os.environ | {
            "HETEROFLOW_HOME": home,
            "HETEROFLOW_DATABASE_URL": database_url,
            "HETEROFLOW_NATS_URL": nats_url,
            "HETEROFLOW_PORT": str(port),
            "HETEROFLOW_METRICS_PORT": str(probe),
            "HETEROFLOW_GATEWAY_WORKERS": "2",
            "HETEROFLOW_LOG_LEVEL": "warning",
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "heteroflow.cli", "service", "api-gateway"],
            env=env,
            start_new_session=True,
        )
        try:
            yield proc, port, probe
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


async def tenant_key(database_url: str) -> str:
    store = await EventStore.open(database_url)
    try:
        await auth.create_tenant(store, "acme", "Acme")
        return (await auth.issue_api_key(store, "acme", "ci"))[1]
    finally:
        await store.close()


def test_two_workers_serve_restart_and_stop(
    database_url: str, gateway: tuple[subprocess.Popen[bytes], int, int]
) -> None:
    key = asyncio.run(tenant_key(database_url))
    proc, port, probe = gateway
    parent = psutil.Process(proc.pid)
    url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {key}"}
    wait_until(lambda: answers(f"http://127.0.0.1:{probe}/readyz"), 60.0, 0.2, "every worker ready")

    # Ready means both workers answer; psutil may still show a just-spawned child under its
    # parent's command line for a moment, so the two are counted until they show as workers.
    def two_workers() -> set[int] | None:
        found = workers_of(parent)
        return found if len(found) == 2 else None

    first: set[int] = wait_until(
        two_workers,
        30.0,
        0.2,
        lambda: f"two gateway workers, found {workers_of(parent)}",
    )
    assert all(listens(pid, port) for pid in first)
    for _ in range(10):  # a fresh connection each time: the kernel hands them to either
        r = web.post(f"{url}/api/v1/tasks", json=BODY, headers=headers, timeout=10)
        assert r.status_code == 201, r.text

    victim = min(first)
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: len(workers_of(parent) - first) == 1, 60.0, 0.2, "a replacement worker")
    wait_until(lambda: answers(f"http://127.0.0.1:{probe}/readyz"), 60.0, 0.2, "ready again")
    second = workers_of(parent)
    assert victim not in second and len(second) == 2
    r = web.post(f"{url}/api/v1/tasks", json=BODY, headers=headers, timeout=10)
    assert r.status_code == 201, r.text

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    wait_until(lambda: not any(psutil.pid_exists(pid) for pid in second), 15, 0.2, "workers gone")
