"""A three-server NATS JetStream cluster for tests: `nats-server` processes from the pip
package (the binary the embedded mode runs), clustered over local routes, no Docker."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from libs.embedded import _free_port, nats_server_binary


@dataclass
class ClusterServer:
    name: str
    port: int
    route_port: int
    root: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def config(self, routes: list[int]) -> str:
        return (
            f"server_name: {self.name}\n"
            f"listen: 127.0.0.1:{self.port}\n"
            f"jetstream {{\n  store_dir: {json.dumps(str(self.root / 'js'))}\n"
            "  sync_interval: always\n}\n"
            f"cluster {{\n  name: hf\n  listen: 127.0.0.1:{self.route_port}\n"
            f"  routes: {json.dumps([f'nats-route://127.0.0.1:{p}' for p in routes])}\n}}\n"
        )

    def start(self, routes: list[int]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        conf = self.root / "nats.conf"
        conf.write_text(self.config(routes))
        logf = open(self.root / "nats.log", "ab")  # noqa: SIM115 - owned by the child
        self.process = subprocess.Popen(
            [nats_server_binary(), "-c", str(conf)],
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self) -> None:
        """SIGKILL: no goodbye to the peers or the clients."""
        if self.process and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False


@dataclass
class NatsCluster:
    root: Path
    size: int = 3
    servers: list[ClusterServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        """Every server, comma-separated: the form HETEROFLOW_NATS_URL takes."""
        return ",".join(srv.url for srv in self.servers)

    def start(self, timeout: float = 20.0) -> NatsCluster:
        self.servers = [
            ClusterServer(f"n{i}", _free_port(), _free_port(), self.root / f"n{i}")
            for i in range(1, self.size + 1)
        ]
        for srv in self.servers:
            srv.start([o.route_port for o in self.servers if o is not srv])
        deadline = time.monotonic() + timeout
        while not all(srv.listening() for srv in self.servers):
            for srv in self.servers:
                if srv.process and srv.process.poll() is not None:
                    log = (srv.root / "nats.log").read_text()[-2000:]
                    raise RuntimeError(f"{srv.name} exited: {log}")
            if time.monotonic() > deadline:
                raise RuntimeError("the NATS cluster did not listen in time")
            time.sleep(0.1)
        return self

    def by_url(self, url: str) -> ClusterServer:
        port = int(url.rsplit(":", 1)[1])
        return next(srv for srv in self.servers if srv.port == port)

    def stop(self) -> None:
        for srv in self.servers:
            if srv.process and srv.process.poll() is None:
                srv.process.terminate()
                try:
                    srv.process.wait(10)
                except subprocess.TimeoutExpired:
                    srv.kill()
