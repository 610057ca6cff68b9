"""deploy/compose.yaml run with the docker SDK: the part of Compose the file uses (image,
entrypoint, command, environment, user, volumes, ports, restart, `${VAR}`), one network per
project, each container reachable by its service name. Compose v2 is not installed here.

`Compose.deploy()` brings the whole deployment up in order (servers, first credentials, the
rest) and waits until it serves; the compose test and the `deploy` benchmark suite share it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import httpx
import psycopg
import yaml
from docker.models.containers import Container

from tests.wait import wait_until

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "deploy" / "compose.yaml"
BUILD = REPO / "deploy" / "images" / "build.sh"
BOOTSTRAP = REPO / "deploy" / "compose_bootstrap.py"
_VARIABLE = re.compile(r"\$\$|\$\{(\w+)\}")
BASE_IMAGE = "heteroflow/base:bookworm"
AGENTS = {"agent-1": "compose-agent-1", "agent-2": "compose-agent-2", "agent-3": "compose-agent-3"}
GATEWAYS = ("api-gateway-1", "api-gateway-2")
SCHEDULERS = ("scheduler-1", "scheduler-2")
POLL_S = 0.2


def wait(cond: Callable[[], bool], what: str, timeout: float, logs: Callable[[], str]) -> None:
    """Poll `cond` until it holds; fail with `what` and `logs()` after `timeout` seconds."""

    def holds() -> bool:
        try:
            return cond()
        except (httpx.HTTPError, psycopg.OperationalError):
            return False  # not up yet

    wait_until(holds, timeout, POLL_S, lambda: f"{what}\n{logs()}")


def why_not_here() -> str:
    """Empty when the deployment can run here (a Docker engine answers and
    `deploy/images/build.sh` can build the images), else the reason it cannot."""
    try:
        client = docker.from_env(timeout=3)
        client.ping()
    except docker.errors.DockerException:
        return "no Docker engine answers (CI installs one: .ci/setup-docker.sh)"
    if shutil.which("mmdebstrap") is None:
        try:
            client.images.get(BASE_IMAGE)
        except docker.errors.DockerException:
            return f"the base image needs mmdebstrap (apt-get install mmdebstrap) or {BASE_IMAGE}"
    return ""


def build_images() -> None:
    """The three images (`just images`); cached, so a second call only checks its layers."""
    done = subprocess.run(["bash", str(BUILD), "all"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr


def _interpolate(value: Any, variables: dict[str, str]) -> Any:
    """Compose's `${VAR}` from `variables` (what Compose reads from `.env`); `$$` is a `$`."""
    if isinstance(value, str):
        return _VARIABLE.sub(lambda m: "$" if m[0] == "$$" else variables[m[1]], value)
    if isinstance(value, list):
        return [_interpolate(v, variables) for v in value]
    return value


def _load_bootstrap() -> Any:
    """deploy/compose_bootstrap.py, the deployment's own first-credentials script."""
    spec = importlib.util.spec_from_file_location("compose_bootstrap", BOOTSTRAP)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


@dataclass
class Compose:
    file: Path = COMPOSE_FILE
    project: str = field(default_factory=lambda: "hfc" + uuid.uuid4().hex[:6])
    client: docker.DockerClient = field(default_factory=docker.from_env)
    containers: dict[str, Container] = field(default_factory=dict)

    key: str = ""  # the tenant's API key, once deployed
    operator: str = ""  # an operator token, once deployed
    # Where the relative volumes (./nats-auth.conf) and the variables (.env) come from: the
    # bootstrap script's output, here a directory of this deployment's own.
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="hf-compose-")))
    variables: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.services: dict[str, dict[str, Any]] = yaml.safe_load(self.file.read_text())["services"]
        self.network = self.client.networks.create(
            self.project, labels={"heteroflow.test": self.project}
        )

    def up(self, *names: str, env: dict[str, str] | None = None) -> None:
        for name in names or tuple(self.services):
            self.start(name, env or {})

    def start(self, name: str, env: dict[str, str]) -> Container:
        spec = self.services[name]
        given = (spec.get("environment") or {}).items()
        environment = {k: _interpolate(str(v), self.variables) for k, v in given} | env
        binds = [self._bind(v) for v in spec.get("volumes", [])]
        ports = {str(p).split(":")[-1] + "/tcp": None for p in spec.get("ports", [])}
        container = self.client.containers.create(
            spec["image"],
            command=_interpolate(spec.get("command"), self.variables),
            entrypoint=spec.get("entrypoint"),
            environment=environment,
            user=str(spec["user"]) if "user" in spec else None,
            # As Compose does: a service that exits on its own (a scheduler whose first
            # JetStream request timed out while the cluster formed) is started again; one
            # killed through the API is not (Docker counts that as stopped by hand).
            restart_policy={"Name": spec["restart"]} if "restart" in spec else None,
            volumes=binds,
            ports=ports,
            name=f"{self.project}-{name}",
            hostname=name,
            labels={"heteroflow.test": self.project, "heteroflow.test.service": name},
            network=self.network.name,
            networking_config={
                self.network.name: self.client.api.create_endpoint_config(aliases=[name])
            },
        )
        container.start()
        self.containers[name] = container
        return container

    def _bind(self, volume: str) -> str:
        source, rest = volume.split(":", 1)
        return f"{self.workdir / source}:{rest}" if source.startswith("./") else volume

    def deploy(self, agent_env: dict[str, str] | None = None) -> None:
        """Every service, in order: PostgreSQL, the first credentials and NATS logins
        (deploy/compose_bootstrap.py), NATS, then the rest; back when both gateways are ready
        and the three agents are online."""
        self.up("postgres")

        def accepts() -> bool:
            with psycopg.connect(self.database_url, connect_timeout=2):
                return True

        wait(accepts, "postgres accepts logins", 30, lambda: self.logs("postgres"))
        script = _load_bootstrap()
        creds = asyncio.run(script.bootstrap(self.database_url))
        script.write(self.workdir, creds)
        self.key, self.operator = creds.tenant_key, creds.operator_token
        self.variables = {script.env_name(s): k for s, k in creds.agent_keys.items()}
        self.up("nats-1", "nats-2", "nats-3")
        rest = [n for n in self.services if n not in self.containers]
        self.up(*(n for n in rest if n not in AGENTS))
        self.up(*(n for n in rest if n in AGENTS), env=agent_env)

        def ready() -> bool:
            return all(httpx.get(f"{g}/readyz", timeout=1).status_code == 200 for g in self.urls)

        wait(ready, "both gateways ready", 60, lambda: self.logs(GATEWAYS[0]))
        ops = {"Authorization": f"Bearer {self.operator}"}

        def nodes_online() -> bool:
            r = httpx.get(f"{self.urls[0]}/api/v1/nodes", headers=ops, timeout=5)
            online = {n["id"] for n in r.json()["nodes"] if n["status"] == "online"}
            return set(AGENTS.values()) <= online

        wait(nodes_online, "three agents online", 60, lambda: self.logs("agent-1"))

    @property
    def database_url(self) -> str:
        port = self.port("postgres", 5432)
        return f"postgresql://heteroflow:change-me@127.0.0.1:{port}/heteroflow"

    @property
    def urls(self) -> list[str]:
        """The gateways' base URLs, as published on this host."""
        return [f"http://127.0.0.1:{self.port(g, 3333)}" for g in GATEWAYS]

    def port(self, name: str, container_port: int) -> int:
        container = self.containers[name]
        container.reload()
        return int(container.ports[f"{container_port}/tcp"][0]["HostPort"])

    def kill(self, name: str) -> None:
        self.containers[name].kill()

    def running(self, name: str) -> bool:
        container = self.containers[name]
        container.reload()
        return bool(container.status == "running")

    def logs(self, name: str, tail: int = 40) -> str:
        logs: bytes = self.containers[name].logs(tail=tail)
        return logs.decode(errors="replace")

    def down(self) -> None:
        def remove(container: Container) -> None:
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True, v=True)

        # One at a time takes ~2 s a container on a busy machine.
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(remove, self.containers.values()))
        with contextlib.suppress(docker.errors.APIError):
            self.network.remove()
        shutil.rmtree(self.workdir, ignore_errors=True)
        for node in AGENTS.values():  # the task containers the agents started
            for c in self.client.containers.list(
                all=True, filters={"label": f"heteroflow.node={node}"}
            ):
                with contextlib.suppress(docker.errors.APIError):
                    c.remove(force=True)
