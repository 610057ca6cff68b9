"""The pid-file logic of the embedded servers (libs/pidfile.py), with real (tiny) processes
standing in for servers: what a record says (absent, in use, orphan), recycled pids not
mistaken for the recorded process, orphans stopped (SIGKILL when they ignore the signal),
a live owner's server refused, and one `up` per state directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from libs import pidfile
from libs.pidfile import Found, PidRecord, StoreInUse, UpLock

MARK = "hf-pidfile-test-server"


@pytest.fixture
def server() -> Iterator[subprocess.Popen[bytes]]:
    """A process whose command line says which store it serves (like `postgres -D <dir>`)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", MARK])
    yield proc
    proc.kill()
    proc.wait()


def is_server(argv: list[str]) -> bool:
    return MARK in argv


def ended_pid() -> int:
    """The pid of a process that has ended (an owner killed with SIGKILL)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_record_round_trips(tmp_path: Path, server: subprocess.Popen[bytes]) -> None:
    path = tmp_path / "server.pid"
    rec = pidfile.record(path, server.pid, ["server", "-c", "x.conf"])
    assert pidfile.read(path) == rec
    assert rec.owner_pid == os.getpid() and rec.started > 0
    assert not path.with_name("server.pid.tmp").exists()


@pytest.mark.parametrize("text", ["", "{", '{"pid": 1}', '{"pid": "x", "started": 1}'])
def test_an_unreadable_record_is_no_record(tmp_path: Path, text: str) -> None:
    path = tmp_path / "server.pid"
    path.write_text(text)
    assert pidfile.read(path) is None
    assert pidfile.read(tmp_path / "missing.pid") is None


def test_classify(tmp_path: Path, server: subprocess.Popen[bytes]) -> None:
    path = tmp_path / "server.pid"
    live = pidfile.record(path, server.pid, [MARK])
    gone = ended_pid()
    cases: list[tuple[str, PidRecord | None, Found]] = [
        ("no record", None, Found.ABSENT),
        ("server ended", replace(live, pid=gone), Found.ABSENT),
        ("server pid recycled", replace(live, started=live.started - 100), Found.ABSENT),
        ("owner alive (this process)", live, Found.IN_USE),
        ("owner ended", replace(live, owner_pid=gone), Found.ORPHAN),
        ("owner pid recycled", replace(live, owner_started=live.owner_started - 100), Found.ORPHAN),
    ]
    for label, rec, expected in cases:
        assert pidfile.classify(rec, is_server) is expected, label
    # A live process that is not this store's server (another command line) is no server.
    assert pidfile.classify(live, lambda argv: False) is Found.ABSENT


def write_orphan(path: Path, pid: int) -> None:
    rec = pidfile.record(path, pid, [MARK])
    path.write_text(json.dumps(rec.__dict__ | {"owner_pid": ended_pid()}))


def test_clear_stops_an_orphan_and_removes_its_record(
    tmp_path: Path, server: subprocess.Popen[bytes]
) -> None:
    path = tmp_path / "server.pid"
    write_orphan(path, server.pid)
    pidfile.clear(path, is_server, "test-server", signal.SIGTERM)
    assert pidfile.start_time(server.pid) is None  # ended (and reaped by the wait)
    assert not path.exists()


def test_clear_refuses_a_server_whose_owner_lives(
    tmp_path: Path, server: subprocess.Popen[bytes]
) -> None:
    path = tmp_path / "server.pid"
    pidfile.record(path, server.pid, [MARK])
    with pytest.raises(StoreInUse, match=f"pid {server.pid}"):
        pidfile.clear(path, is_server, "test-server", signal.SIGTERM)
    assert server.poll() is None and path.exists()


def test_clear_stops_an_unrecorded_server_of_the_store(
    tmp_path: Path, server: subprocess.Popen[bytes]
) -> None:
    """A server started without a record (an older version's) is found by its command line."""
    pidfile.clear(tmp_path / "server.pid", is_server, "test-server", signal.SIGTERM)
    assert pidfile.start_time(server.pid) is None


def test_clear_with_a_stale_record_stops_nothing(tmp_path: Path) -> None:
    path = tmp_path / "server.pid"
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        rec = pidfile.record(path, bystander.pid, ["other"])
        # The recorded pid now belongs to an unrelated process (recycled): left alone.
        path.write_text(json.dumps(rec.__dict__ | {"owner_pid": ended_pid()}))
        pidfile.clear(path, is_server, "test-server", signal.SIGTERM)
        assert bystander.poll() is None and not path.exists()
    finally:
        bystander.kill()
        bystander.wait()


def test_terminate_kills_a_process_that_ignores_the_signal() -> None:
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
            " print('ready', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
    assert pidfile.terminate(stubborn.pid, signal.SIGTERM, grace_s=0.3) == -signal.SIGKILL


def test_one_up_per_state_directory(tmp_path: Path) -> None:
    first = UpLock(tmp_path).acquire()
    with pytest.raises(StoreInUse, match=f"pid {os.getpid()}"):
        UpLock(tmp_path).acquire()
    first.release()
    UpLock(tmp_path).acquire().release()


def test_the_lock_of_a_killed_up_is_free(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from libs.pidfile import UpLock;"
            f" lock = UpLock(Path({str(tmp_path)!r})).acquire(); print('held', flush=True);"
            " time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
    with pytest.raises(StoreInUse):
        UpLock(tmp_path).acquire()
    holder.kill()
    holder.wait()
    UpLock(tmp_path).acquire().release()
