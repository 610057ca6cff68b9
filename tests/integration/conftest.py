"""Integration fixtures: a gateway app over a real store, with an operator and tenant keys."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from libs.config import GatewaySettings
from libs.embedded import EmbeddedNats
from libs.store.eventstore import EventStore

from .cluster import Cluster
from .helpers import Api, gateway_api


@pytest.fixture
async def api(database_url: str) -> AsyncIterator[Api]:
    store = await EventStore.open(database_url, max_size=30)
    settings = GatewaySettings(
        jwt_secret=SecretStr("test-secret-0123456789abcdef0123456789"),
        volume_allow_list=["/data", "/tmp/heteroflow"],
    )
    try:
        async with gateway_api(store, settings) as api:
            yield api
    finally:
        await store.close()


@pytest.fixture
def cluster(request: pytest.FixtureRequest, database_url: str) -> Iterator[Cluster]:
    """A control plane (`heteroflow up`, no local agent) on its own NATS server; add agents
    with `cluster.start_agent(...)`. `@pytest.mark.cluster_env(KEY="v")` adds settings."""
    marker = request.node.get_closest_marker("cluster_env")
    extra: dict[str, str] = dict(marker.kwargs) if marker else {}
    root = Path(tempfile.mkdtemp(prefix="hf-cluster-"))
    nats_server = EmbeddedNats(root / "nats").start()
    c = Cluster(root, database_url, nats_server)
    try:
        yield c.start(**extra)
    finally:
        c.stop()
        nats_server.stop()
        shutil.rmtree(root, ignore_errors=True)


def docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


requires_docker = pytest.mark.skipif(
    not docker_answers(), reason="no Docker engine answers (CI installs one: .ci/setup-docker.sh)"
)
