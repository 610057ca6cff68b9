"""deploy/compose.yaml run with the docker SDK: the part of Compose the file uses (image,
entrypoint, command, environment, user, volumes, ports), one network per project, each
container reachable by its service name. Compose v2 is not installed on our machines."""

from __future__ import annotations

import contextlib
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import yaml
from docker.models.containers import Container

COMPOSE_FILE = Path(__file__).resolve().parents[2] / "deploy" / "compose.yaml"


def _unescape(value: Any) -> Any:
    """Compose's `$$` is a literal `$`."""
    if isinstance(value, str):
        return value.replace("$$", "$")
    if isinstance(value, list):
        return [_unescape(v) for v in value]
    return value


@dataclass
class Compose:
    file: Path = COMPOSE_FILE
    project: str = field(default_factory=lambda: "hfc" + uuid.uuid4().hex[:6])
    client: docker.DockerClient = field(default_factory=docker.from_env)
    containers: dict[str, Container] = field(default_factory=dict)

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
        environment = {k: str(v) for k, v in (spec.get("environment") or {}).items()} | env
        binds = [v for v in spec.get("volumes", []) if v.startswith("/")]
        ports = {str(p).split(":")[-1] + "/tcp": None for p in spec.get("ports", [])}
        container = self.client.containers.create(
            spec["image"],
            command=_unescape(spec.get("command")),
            entrypoint=spec.get("entrypoint"),
            environment=environment,
            user=str(spec["user"]) if "user" in spec else None,
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
