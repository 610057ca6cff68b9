"""The embedded servers' life with real nats-server and postgres processes: orphans of an
owner killed with SIGKILL are stopped before a new server starts on the same store, a live
owner's servers are never doubled (refused, or attached to by the ops commands), an owner
that exits stops its servers, and the supervisor starts a SIGKILLed server again on the
same port and socket, with the data kept."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from libs import pidfile
from libs.bus.nats import connect
from libs.embedded import EmbeddedNats, EmbeddedPostgres
from libs.pidfile import StoreInUse
from libs.server_supervisor import RESTARTS, ServerSupervisor
from tests.wait import wait_until_async

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]

# An owner of both servers in another process: prints their pids once they run, stops them
# on SIGTERM (atexit), and leaves them behind on SIGKILL.
OWNER = """
import signal, sys, time
from pathlib import Path
import psycopg
from libs.embedded import EmbeddedNats, EmbeddedPostgres
root = Path(sys.argv[1])
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
nats = EmbeddedNats(root / "nats", port=int(sys.argv[2])).start()
pg = EmbeddedPostgres(root / "pg").start()
with psycopg.connect(pg.url, autocommit=True) as conn:
    conn.execute("CREATE TABLE IF NOT EXISTS kept (n int)")
print("ready", nats.pid, pg.pid, flush=True)
time.sleep(120)
"""


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hf-embedded-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start_owner(root: Path, port: int) -> tuple[subprocess.Popen[bytes], int, int]:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(root), str(port)], stdout=subprocess.PIPE, cwd=REPO
    )
    assert owner.stdout is not None
    for raw in owner.stdout:  # its log lines come first
        line = raw.decode().split()
        if line and line[0] == "ready":
            return owner, int(line[1]), int(line[2])
    raise AssertionError(f"owner did not start its servers (exit {owner.wait()})")


def alive(pid: int) -> bool:
    return pidfile.start_time(pid) is not None


def servers_of(server: EmbeddedNats | EmbeddedPostgres) -> list[int]:
    return pidfile.find(server._is_server)


def has_table(url: str) -> bool:
    with psycopg.connect(url, connect_timeout=5) as conn:
        row = conn.execute("SELECT to_regclass('kept') IS NOT NULL").fetchone()
    return bool(row and row[0])


def test_orphans_of_a_killed_owner_are_stopped_before_a_server_starts(root: Path) -> None:
    port = _free_port()
    owner, nats_pid, pg_pid = start_owner(root, port)
    owner.kill()
    owner.wait()
    assert alive(nats_pid) and alive(pg_pid), "SIGKILL of the owner leaves both servers"

    nats = EmbeddedNats(root / "nats", port=port).start()
    pg = EmbeddedPostgres(root / "pg").start()
    try:
        assert not alive(nats_pid) and not alive(pg_pid)
        assert servers_of(nats) == [nats.pid] and servers_of(pg) == [pg.pid]
        assert has_table(pg.url)  # the same data, no second cluster
        assert pidfile.read(nats.pid_file).pid == nats.pid  # type: ignore[union-attr]
        assert pidfile.read(pg.pid_file).pid == pg.pid  # type: ignore[union-attr]
    finally:
        nats.stop()
        pg.stop()
    assert servers_of(nats) == [] and servers_of(pg) == []
    assert not nats.pid_file.exists() and not pg.pid_file.exists()


def test_a_live_owners_servers_are_never_doubled_and_go_with_it(root: Path) -> None:
    port = _free_port()
    owner, nats_pid, pg_pid = start_owner(root, port)
    try:
        with pytest.raises(StoreInUse, match=f"pid {nats_pid}"):
            EmbeddedNats(root / "nats", port=port).start()
        with pytest.raises(StoreInUse, match=f"pid {pg_pid}"):
            EmbeddedPostgres(root / "pg").start()
        # The ops commands attach to a running server and leave it running.
        attached = EmbeddedPostgres(root / "pg", attach=True).start()
        assert has_table(attached.url)
        attached.stop()
        assert alive(nats_pid) and alive(pg_pid)
    finally:
        owner.send_signal(signal.SIGTERM)
        owner.wait(60)
    assert not alive(nats_pid) and not alive(pg_pid), "an owner that exits stops its servers"


async def test_the_supervisor_starts_a_killed_server_again(root: Path) -> None:
    nats = EmbeddedNats(root / "nats").start()
    pg = EmbeddedPostgres(root / "pg").start()
    stop = asyncio.Event()
    sup = ServerSupervisor({"nats-server": nats, "postgres": pg}, first_backoff_s=0.2)
    watch = asyncio.create_task(sup.run(stop))
    nc = await connect(nats.url, "supervisor-test")
    try:
        url, port = pg.url, nats.port
        await asyncio.to_thread(_make_table, url)
        before = {n: RESTARTS.labels(n)._value.get() for n in ("nats-server", "postgres")}
        old = {"nats-server": nats.pid, "postgres": pg.pid}
        for pid in old.values():
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
        await wait_until_async(
            lambda: all(RESTARTS.labels(n)._value.get() == before[n] + 1 for n in before),
            60.0,
            0.05,
            "both servers started again",
        )
        assert nats.pid != old["nats-server"] and pg.pid != old["postgres"]
        await wait_until_async(
            lambda: nc.is_connected, 60.0, 0.05, "the NATS client reconnected by itself"
        )
        assert pg.url == url and nats.port == port
        assert await asyncio.to_thread(has_table, url)
        assert servers_of(nats) == [nats.pid] and servers_of(pg) == [pg.pid]
    finally:
        await nc.close()
        stop.set()
        await asyncio.wait_for(watch, 10)
        nats.stop()
        pg.stop()


def _make_table(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (n int)")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
