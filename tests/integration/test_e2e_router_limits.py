"""The router lets go of what it does not need (docs/serving.md, "Limits and cancellation"):
request bodies stream to the replica instead of being held whole, a client that leaves
cancels its upstream request, and a replica that never answers gets 504.

`heteroflow up` (gateway in-process) with one process node; the replica is a small Python
HTTP server that discards uploads, and on `/hold/...` never answers but writes to a log when
the request arrives and when its connection is closed.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from . import web
from .cluster import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPLICA = r"""
import os, select, socket, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG = os.environ["HOLD_LOG"]


def note(line):
    with open(LOG, "a") as f:
        f.write(line + "\n")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, body):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if not self.path.startswith("/hold"):
            return self.answer(b"ok")
        note("open " + self.path)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            readable, _, _ = select.select([self.connection], [], [], 0.1)
            if readable and not self.connection.recv(1, socket.MSG_PEEK):
                break
        note("closed " + self.path)
        self.close_connection = True

    def do_POST(self):
        left, got = int(self.headers.get("Content-Length", "0")), 0
        while left > 0:
            n = len(self.rfile.read(min(left, 65536)))
            if not n:
                break
            left, got = left - n, got + n
        self.answer(str(got).encode())


ThreadingHTTPServer.daemon_threads = True
# The default listen backlog (5) overflows under 40 uploads at once: the kernel then resets
# connections the router had opened, a replica fault rather than the router's.
ThreadingHTTPServer.request_queue_size = 256
ThreadingHTTPServer(("0.0.0.0", int(os.environ["PORT"])), Handler).serve_forever()
"""


def start_replica(cluster: Cluster) -> tuple[str, Path]:
    """A running, ready replica: its task id and the log it keeps of held requests."""
    script, log = cluster.root / "replica.py", cluster.root / "hold.log"
    script.write_text(REPLICA)
    log.touch()
    cluster.start_agent("rl1", "process")
    task = cluster.create(
        name="sink",
        task_type="inference",
        command=f"exec {sys.executable} {script}",
        env={"HOLD_LOG": str(log)},
        serving={"port": 8000, "health_path": "/healthz"},
    )
    cluster.wait_status(task["id"], "running", timeout=60)
    cluster.wait(lambda: call(cluster, task["id"], "healthz").status_code == 200, "replica ready")
    return task["id"], log


def call(cluster: Cluster, target: str, path: str, **kw: Any) -> httpx.Response:
    kw.setdefault("timeout", httpx.Timeout(30.0, connect=2.0))
    return httpx.get(f"{cluster.url}/serve/{target}/{path}", headers=cluster.tenant, **kw)


def in_flight(cluster: Cluster, target: str) -> tuple[int, int]:
    """(the replica's outstanding count, the target's concurrent requests) at the router."""
    r = web.get(f"{cluster.url}/api/v1/tasks/{target}/serving", headers=cluster.tenant)
    view = r.json()
    return int(view["replicas"][0]["outstanding"]), int(view["concurrent_requests"])


def uploads(cluster: Cluster, target: str, n: int, body: bytes) -> list[tuple[int, str]]:
    async def run() -> list[tuple[int, str]]:
        limits = httpx.Limits(max_connections=n)
        async with httpx.AsyncClient(limits=limits, timeout=120.0) as client:

            async def one() -> tuple[int, str]:
                url = f"{cluster.url}/serve/{target}/upload"
                r = await client.post(url, content=body, headers=cluster.tenant)
                return r.status_code, r.text

            return await asyncio.gather(*(one() for _ in range(n)))

    return asyncio.run(run())


class PeakRss(threading.Thread):
    """The largest resident size of a process while it runs (sampled)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.peak = self.proc.memory_info().rss
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.02):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.join()


@pytest.mark.cluster_env(HETEROFLOW_SERVE_MAX_BODY_BYTES=str(16 * 1024 * 1024))
def test_large_bodies_stream_and_a_client_that_leaves_cancels_its_request(
    cluster: Cluster,
) -> None:
    target, log = start_replica(cluster)
    assert cluster.control is not None
    n, size = 40, 8 * 1024 * 1024
    body = b"x" * size
    assert uploads(cluster, target, 1, body) == [(200, str(size))]  # warm
    before = psutil.Process(cluster.control.pid).memory_info().rss
    with PeakRss(cluster.control.pid) as rss:
        answers = uploads(cluster, target, n, body)
    assert answers == [(200, str(size))] * n
    grew = rss.peak - before
    print(f"\n{n} concurrent bodies of {size >> 20} MiB: `up` RSS grew {grew / 2**20:.1f} MiB")
    assert grew < n * size / 4, f"RSS grew {grew / 2**20:.0f} MiB for {n * size >> 20} MiB sent"

    # A client that leaves while the replica has not answered: released at once.
    host, port = cluster.url.removeprefix("http://").split(":")
    key = cluster.tenant["Authorization"]
    client = socket.create_connection((host, int(port)))
    client.sendall(
        f"GET /serve/{target}/hold/b HTTP/1.1\r\nHost: x\r\nAuthorization: {key}\r\n\r\n".encode()
    )
    cluster.wait(lambda: "open /hold/b" in log.read_text(), "the replica has the request")
    assert in_flight(cluster, target) == (1, 1)
    client.close()
    cluster.wait(lambda: in_flight(cluster, target) == (0, 0), "outstanding released", 10)
    cluster.wait(lambda: "closed /hold/b" in log.read_text(), "upstream connection closed", 10)
    exported = web.get(f"{cluster.url}/metrics").text
    assert f'heteroflow_serve_requests_total{{status="499",target="{target}"}} 1.0' in exported
    assert call(cluster, target, "healthz").text == "ok"  # and the router serves on


@pytest.mark.cluster_env(HETEROFLOW_SERVE_FIRST_BYTE_TIMEOUT_S="2")
def test_a_replica_that_never_answers_gets_504_after_the_first_byte_timeout(
    cluster: Cluster,
) -> None:
    target, log = start_replica(cluster)
    started = time.monotonic()
    r = call(cluster, target, "hold/c")
    waited = time.monotonic() - started
    assert r.status_code == 504, r.text
    error = r.json()
    assert error["code"] == 50401 and target in error["error"], error
    assert "did not begin its answer within 2s" in error["error"], error
    assert waited >= 2.0
    cluster.wait(lambda: "closed /hold/c" in log.read_text(), "upstream connection closed", 10)
    assert in_flight(cluster, target) == (0, 0)
    assert call(cluster, target, "healthz").text == "ok"
