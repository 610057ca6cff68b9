"""Two platform installations on one Docker engine, with the same node name: each agent's
runtime lists (and so re-adopts) only its own installation's containers. Real engine,
`busybox:latest`; skipped when no engine answers."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from agent.runtimes.base import LABEL_INSTALLATION, LABEL_MANAGED, LABEL_NODE, RunSpec
from agent.runtimes.docker import DockerRuntime
from libs.installation import installation_id

pytestmark = [pytest.mark.integration, pytest.mark.docker]

IMAGE = "busybox:latest"


@pytest.fixture(scope="module")
def engine() -> Iterator[docker.DockerClient]:
    if not DockerRuntime.available():
        pytest.skip("no Docker engine answers (run .ci/setup-docker.sh as root to start one)")
    client = docker.from_env()
    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        pytest.skip(f"{IMAGE} is not built (run .ci/setup-docker.sh)")
    yield client
    client.close()


def spec(task_id: str) -> RunSpec:
    return RunSpec.model_validate(
        {
            "task_id": task_id,
            "attempt": 0,
            "image": IMAGE,
            "command": "sleep 30",
            "memory_mb": 64,
            "cpu_cores": 0.5,
            "labels": {LABEL_NODE: "same-node"},
        }
    )


async def test_installations_sharing_an_engine_and_a_node_name_do_not_adopt_each_others(
    engine: docker.DockerClient, tmp_path: Path
) -> None:
    first, second = installation_id(tmp_path / "a"), installation_id(tmp_path / "b")
    assert first != second and installation_id(tmp_path / "a") == first  # kept, not remade
    a = DockerRuntime(owner="same-node", installation=first, wait_poll_s=1.0)
    b = DockerRuntime(owner="same-node", installation=second, wait_poll_s=1.0)
    run = uuid.uuid4().hex[:8]
    try:
        mine = await a.start(spec(f"i{run}-a"))
        theirs = await b.start(spec(f"i{run}-b"))
        listed_a = {h.task_id for h in await a.list_managed()}
        listed_b = {h.task_id for h in await b.list_managed()}
        assert mine.task_id in listed_a and theirs.task_id not in listed_a
        assert theirs.task_id in listed_b and mine.task_id not in listed_b
        container = engine.containers.get(mine.id)
        assert container.labels[LABEL_INSTALLATION] == first
    finally:
        for c in engine.containers.list(all=True, filters={"label": f"{LABEL_MANAGED}=true"}):
            if c.name.startswith(f"hf-i{run}"):
                c.remove(force=True)
        await a.close()
        await b.close()
