"""Slow clients cost only themselves, on the whole platform (`heteroflow up`), with real
sockets held open the way a slow or hostile client holds them.

* One tenant's 70 uploads, each trickling its body a byte a second (past the gateway's 64
  write slots), and 10 connections trickling their headers: the other tenant's creates are
  all answered 201 meanwhile, and every trickling request is cut off with 408 by its
  deadline.
* One tenant's writes held in flight (the event table locked): it gets its share of the
  write slots and no more, and the other tenant's write takes a slot instead of a 503.
* 1,100 idle sockets against a gateway whose open-files limit is 1,024: other clients are
  served, every idle socket is closed by the gateway, and the log holds no flood of failed
  `accept()` lines.
"""

from __future__ import annotations

import re
import resource
import select
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from libs.embedded import EmbeddedNats
from tests.wait import wait_until

from . import web
from .cluster import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

UPLOADS = 70  # past the 64 write slots of a gateway process (the default)
HEADER_TRICKLES = 10
TRICKLE_EVERY_S = 1.0
HEADER_TIMEOUT_S = 3
BODY_TIMEOUT_S = 4
# What the deadlines may take on a loaded machine before the test calls them missed.
CUT_OFF_WITHIN_S = 30.0
IDLE_SOCKETS = 1100
OPEN_FILES = 1024
# asyncio's line for each failed accept(), and the gateway's (at most one per interval).
ACCEPT_FAILED = ("out of system resource", "gateway_accept_failed")


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def _new_tenant(cluster: Cluster, tenant: str) -> dict[str, str]:
    r = web.post(f"{cluster.url}/api/v1/tenants", json={"id": tenant}, headers=cluster.operator)
    assert r.status_code == 201, r.text
    r = web.post(
        f"{cluster.url}/api/v1/tenants/{tenant}/api-keys",
        json={"name": "k"},
        headers=cluster.operator,
    )
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['key']}"}


class Trickle(threading.Thread):
    """Connections that each send a byte every TRICKLE_EVERY_S until the gateway answers
    or closes; keeps what each received."""

    def __init__(self, socks: list[socket.socket]) -> None:
        super().__init__(daemon=True)
        self.socks = socks
        self.received = {id(s): b"" for s in socks}
        self.ended: set[int] = set()  # id() of each closed one
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set() and len(self.ended) < len(self.socks):
            live = [s for s in self.socks if id(s) not in self.ended]
            deadline = time.monotonic() + TRICKLE_EVERY_S
            while (left := deadline - time.monotonic()) > 0:
                readable, _, _ = select.select(live, [], [], left)
                for s in readable:
                    self._read(s)
                live = [s for s in live if id(s) not in self.ended]
            for s in live:
                try:
                    s.send(b"x")
                except OSError:
                    self._read(s)

    def _read(self, s: socket.socket) -> None:
        try:
            data = s.recv(65536)
        except OSError:
            data = b""
        self.received[id(s)] += data
        if not data:
            self.ended.add(id(s))

    def answers(self) -> list[bytes]:
        return [self.received[id(s)] for s in self.socks]


def _read_until(s: socket.socket, marker: bytes, timeout_s: float) -> bytes:
    s.settimeout(timeout_s)
    data = b""
    while marker not in data:
        part = s.recv(4096)
        if not part:
            break
        data += part
    s.settimeout(None)
    return data


@pytest.mark.cluster_env(
    HETEROFLOW_CLIENT_HEADER_TIMEOUT_S=str(HEADER_TIMEOUT_S),
    HETEROFLOW_CLIENT_BODY_TIMEOUT_S=str(BODY_TIMEOUT_S),
)
def test_trickling_uploads_of_one_tenant_leave_the_others_writes_served(
    cluster: Cluster,
) -> None:
    other = _new_tenant(cluster, "other")
    host, port = _address(cluster.url)
    key = cluster.creds["tenant_api_key"]

    # The uploads: headers whole (each waits for 100 Continue, sent once the gateway
    # hands the request to the application), then a body a byte at a time.
    uploads = []
    for _ in range(UPLOADS):
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(
            (
                "POST /api/v1/tasks HTTP/1.1\r\n"
                f"Host: {host}:{port}\r\n"
                f"Authorization: Bearer {key}\r\n"
                "Content-Type: application/json\r\n"
                "Content-Length: 200\r\n"
                "Expect: 100-continue\r\n\r\n"
            ).encode()
        )
        uploads.append(s)
    for s in uploads:
        first = _read_until(s, b"\r\n\r\n", 20)
        assert first.startswith(b"HTTP/1.1 "), first
    # And connections that never finish their headers.
    headers = []
    for _ in range(HEADER_TRICKLES):
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(f"POST /api/v1/tasks HTTP/1.1\r\nHost: {host}:{port}\r\nX-Slow: ".encode())
        headers.append(s)
    trickle = Trickle(uploads + headers)
    trickle.start()
    try:
        # The other tenant writes meanwhile: every create answered, none shed.
        statuses = []
        started = time.monotonic()
        for i in range(20):
            body = {"name": f"other-{i}", "image": "busybox:latest", "command": "true"}
            r = web.post(f"{cluster.url}/api/v1/tasks", json=body, headers=other)
            statuses.append(r.status_code)
        took = time.monotonic() - started
        assert statuses == [201] * 20, (statuses, took)
        # The trickling ones are cut off by their deadlines: 408, the connection closed.
        wait_until(
            lambda: len(trickle.ended) == len(trickle.socks),
            CUT_OFF_WITHIN_S,
            0.2,
            lambda: (
                f"{len(trickle.ended)} of {len(trickle.socks)} closed\n{cluster.log('control')}"
            ),
        )
    finally:
        trickle.stop.set()
        trickle.join(10)
        for s in uploads + headers:
            s.close()
    answers = trickle.answers()
    for answer in answers[:UPLOADS]:
        assert b"HTTP/1.1 408 " in answer and b'"code":40801' in answer, answer[-300:]
        assert b'"fields":["body"]' in answer, answer[-300:]
    for answer in answers[UPLOADS:]:
        assert answer.startswith(b"HTTP/1.1 408 "), answer[-300:]
        assert b'"fields":["headers"]' in answer, answer[-300:]
    # Nothing of the uploads was recorded.
    r = web.get(f"{cluster.url}/api/v1/tasks", headers=cluster.tenant)
    assert r.json()["total"] == 0, r.text


SHARE_BOUND = 8  # write slots in the share test; a tenant's share is three quarters: 6


def _writes_in_flight(cluster: Cluster) -> float:
    text = web.get(f"{cluster.url}/metrics").text
    found = re.search(r'^heteroflow_gateway_in_flight\{kind="write"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


@pytest.mark.cluster_env(HETEROFLOW_MAX_INFLIGHT_WRITES=str(SHARE_BOUND))
def test_one_tenant_cannot_hold_every_write_slot(cluster: Cluster) -> None:
    other = _new_tenant(cluster, "other")
    cluster.create()  # the tenant's key is known to the gateway from here
    url = f"{cluster.url}/api/v1/tasks"
    body = {"name": "held", "image": "busybox:latest"}
    with ThreadPoolExecutor(SHARE_BOUND + 1) as pool:
        with psycopg.connect(cluster.database_url) as locker:
            # Creates wait on the lock, in flight, for as long as the test holds it.
            locker.execute("LOCK TABLE events IN EXCLUSIVE MODE")
            mine = [
                pool.submit(web.post, url, json=body, headers=cluster.tenant, timeout=60)
                for _ in range(SHARE_BOUND)
            ]
            share = SHARE_BOUND * 3 // 4
            cluster.wait(lambda: _writes_in_flight(cluster) >= share, f"{share} writes in flight")
            theirs = pool.submit(web.post, url, json=body, headers=other, timeout=60)
            cluster.wait(
                lambda: _writes_in_flight(cluster) >= share + 1, "the other tenant's in flight"
            )
        # The lock is let go with the connection: every write held in flight goes on.
        statuses = sorted(f.result().status_code for f in mine)
        assert theirs.result().status_code == 201, theirs.result().text
    assert statuses == [201] * share + [503] * (SHARE_BOUND - share), statuses


def _lower_open_files() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, hard))


@pytest.fixture
def small_cluster(database_url: str) -> Iterator[Cluster]:
    """`up` under an open-files limit of OPEN_FILES (the gateway runs in its process)."""
    root = Path(tempfile.mkdtemp(prefix="hf-slow-"))
    nats_server = EmbeddedNats(root / "nats").start()
    c = Cluster(root, database_url, nats_server, preexec=_lower_open_files)
    try:
        yield c.start(HETEROFLOW_CLIENT_HEADER_TIMEOUT_S=str(HEADER_TIMEOUT_S))
    finally:
        c.stop()
        nats_server.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_idle_sockets_past_the_open_files_limit_starve_nobody(small_cluster: Cluster) -> None:
    cluster = small_cluster
    host, port = _address(cluster.url)
    idle = []
    try:
        for _ in range(IDLE_SOCKETS):
            idle.append(socket.create_connection((host, port), timeout=10))
        # Other clients are served while the sockets are held.
        for _ in range(20):
            r = web.get(f"{cluster.url}/api/v1/tasks", headers=cluster.tenant)
            assert r.status_code == 200, r.text
        r = web.post(
            f"{cluster.url}/api/v1/tasks",
            json={"name": "t", "image": "busybox:latest"},
            headers=cluster.tenant,
        )
        assert r.status_code == 201, r.text

        # Every idle socket is closed by the gateway (the connection cap, the header
        # deadline): none is kept for as long as its client likes.
        open_ = set(idle)

        def all_closed() -> bool:
            poll = select.poll()  # select() takes no descriptor past 1023
            by_fd = {s.fileno(): s for s in open_}
            for fd in by_fd:
                poll.register(fd, select.POLLIN)
            for fd, _ in poll.poll(500):
                s = by_fd[fd]
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    open_.discard(s)
            return not open_

        wait_until(
            all_closed,
            CUT_OFF_WITHIN_S,
            0.1,
            lambda: f"{len(open_)} of {IDLE_SOCKETS} still open",
        )
    finally:
        for s in idle:
            s.close()
    log = (cluster.root / "control.log").read_text(errors="replace")
    failed = sum(any(text in line for text in ACCEPT_FAILED) for line in log.splitlines())
    assert failed <= 5, f"{failed} lines of failed accepts in the log"
