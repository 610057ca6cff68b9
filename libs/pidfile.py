"""Pid files of the embedded servers, telling a live server of ours from an orphan, and
stopping the child server processes.

Whoever starts an embedded server (`heteroflow up`, an ops command, a test fixture) records it
in a pid file inside the server's data directory: the server's pid and kernel start time, its
command line, and the same for the owner (the process that started it). A pid alone proves
nothing (pids are recycled), so a process counts as the one recorded only when its start time
matches too.

On the next start the record says what is there:

* `absent`: no record, or the recorded server has ended (a stale file): start a new one;
* `in_use`: the server runs and its owner is alive: another process runs this store, and a
  second server on it must not start;
* `orphan`: the server runs but its owner is gone (killed with SIGKILL, so nothing stopped
  the server): stop it, then start ours.

`UpLock` keeps a second `heteroflow up` off a state directory while one runs: an exclusive
`flock` that the kernel releases when its holder dies, however it dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import IO

import psutil
import structlog

log = structlog.get_logger(__name__)

# psutil derives create_time from boot time + clock ticks: equal processes agree to 1/100 s.
_START_TIME_TOLERANCE_S = 0.05


class Found(StrEnum):
    ABSENT = "absent"
    IN_USE = "in_use"
    ORPHAN = "orphan"


@dataclass(frozen=True)
class PidRecord:
    """One embedded server as its starter wrote it down."""

    pid: int
    started: float  # the server's kernel start time (epoch seconds)
    argv: list[str]
    owner_pid: int
    owner_started: float


def start_time(pid: int) -> float | None:
    """The kernel start time of a live, non-zombie process; None when there is none."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return float(proc.create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def is_alive(pid: int, started: float) -> bool:
    """The process `pid` runs and is the one that started at `started` (not a recycled pid)."""
    now = start_time(pid)
    return now is not None and abs(now - started) <= _START_TIME_TOLERANCE_S


def record(path: Path, pid: int, argv: Sequence[str]) -> PidRecord:
    """Write the record of server `pid`, owned by this process (atomically: a reader sees the
    old file or the new one, never half of one)."""
    me = os.getpid()
    rec = PidRecord(
        pid=pid,
        started=start_time(pid) or 0.0,
        argv=[str(a) for a in argv],
        owner_pid=me,
        owner_started=start_time(me) or 0.0,
    )
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(asdict(rec)))
    tmp.replace(path)
    return rec


def read(path: Path) -> PidRecord | None:
    """The record in `path`; None when there is none or it cannot be read (a torn write by a
    version that wrote in place: treated as no record, the server check still runs)."""
    try:
        raw = json.loads(path.read_text())
        return PidRecord(
            pid=int(raw["pid"]),
            started=float(raw["started"]),
            argv=[str(a) for a in raw["argv"]],
            owner_pid=int(raw["owner_pid"]),
            owner_started=float(raw["owner_started"]),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("pid_file_unreadable", path=str(path), error=str(exc))
        return None


def classify(rec: PidRecord | None, is_server: Callable[[list[str]], bool]) -> Found:
    """What a record says about its server; `is_server(cmdline)` confirms the live process
    is the server of this data directory (same binary, same configuration or data path)."""
    if rec is None or not is_alive(rec.pid, rec.started) or not is_server(cmdline(rec.pid)):
        return Found.ABSENT
    # The owner's start time tells a live owner (this process included) from a recycled pid.
    if is_alive(rec.owner_pid, rec.owner_started):
        return Found.IN_USE
    return Found.ORPHAN


def cmdline(pid: int) -> list[str]:
    try:
        return [str(a) for a in psutil.Process(pid).cmdline()]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def find(is_server: Callable[[list[str]], bool]) -> list[int]:
    """Pids of live processes whose command line `is_server` recognises: the servers a pid
    file does not know of (started by an older version, or the file was removed)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        info = proc.info
        if info["status"] == psutil.STATUS_ZOMBIE or not info["cmdline"]:
            continue
        if info["pid"] != os.getpid() and is_server([str(a) for a in info["cmdline"]]):
            found.append(int(info["pid"]))
    return found


def terminate(pid: int, sig: signal.Signals = signal.SIGTERM, grace_s: float = 20.0) -> int | None:
    """Send `sig` and wait for the process to end; SIGKILL after `grace_s`. The exit status
    when the process was our child (negative: the signal), else None."""
    try:
        proc = psutil.Process(pid)
        proc.send_signal(sig)
        try:
            status = proc.wait(grace_s)
        except psutil.TimeoutExpired:
            log.warning("orphan_ignored_signal_killing", pid=pid, signal=sig.name)
            proc.kill()
            status = proc.wait(10)
    except psutil.NoSuchProcess:
        return None
    return None if status is None else int(status)


class StoreInUse(RuntimeError):
    """A live process other than this one runs a server on this data directory."""


class UpLock:
    """At most one `heteroflow up` per state directory (an exclusive flock on `up.lock`)."""

    def __init__(self, home: Path) -> None:
        self.path = home / "up.lock"
        self._fh: IO[str] | None = None

    def acquire(self) -> UpLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = self.path.open("a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "?"
            fh.close()
            raise StoreInUse(
                f"another `heteroflow up` (pid {holder}) runs on {self.path.parent}; stop it first"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None


def clear(
    path: Path, is_server: Callable[[list[str]], bool], name: str, sig: signal.Signals
) -> None:
    """Before a server starts on a data directory: stop the orphans of a previous run (the
    recorded server, and any unrecorded process `is_server` recognises), or refuse with
    StoreInUse while a live owner runs one. Never two servers on one store."""
    rec = read(path)
    found = classify(rec, is_server)
    if found is Found.IN_USE:
        assert rec is not None
        raise StoreInUse(
            f"the embedded {name} under {path.parent} runs as pid {rec.pid}, started by live "
            f"pid {rec.owner_pid}; stop that process first"
        )
    pids = [rec.pid] if found is Found.ORPHAN and rec is not None else []
    pids += [pid for pid in find(is_server) if pid not in pids]
    for pid in pids:
        log.warning("embedded_orphan_stopping", server=name, pid=pid, data=str(path.parent))
        started = time.monotonic()
        terminate(pid, sig)
        log.info(
            "embedded_orphan_stopped",
            server=name,
            pid=pid,
            took_s=round(time.monotonic() - started, 2),
        )
    path.unlink(missing_ok=True)


def end_child(proc: subprocess.Popen[bytes], sig: signal.Signals, grace_s: float) -> None:
    """Stop a child server with `sig`, SIGKILL past `grace_s`, and reap it."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            log.warning("embedded_server_killed", pid=proc.pid, ignored=sig.name)
            proc.kill()
            proc.wait()


def forget(path: Path, pid: int) -> None:
    """Remove a pid file that still names `pid` (not one a later server wrote)."""
    rec = read(path)
    if rec is not None and rec.pid == pid:
        path.unlink(missing_ok=True)


def log_tail(logfile: Path, offset: int) -> str:
    with logfile.open("rb") as fh:
        fh.seek(offset)
        return fh.read().decode(errors="replace")[-2000:]
