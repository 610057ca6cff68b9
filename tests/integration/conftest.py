"""Integration fixtures: a gateway app over a real store, with an operator and tenant keys."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from libs import auth
from libs.config import GatewaySettings
from libs.embedded import EmbeddedNats
from libs.store.eventstore import EventStore
from services.api_gateway.app import create_app

from . import web
from .cluster import Cluster
from .helpers import AGENT_NODE, Api, bearer


@pytest.fixture
async def api(database_url: str) -> AsyncIterator[Api]:
    store = await EventStore.open(database_url, max_size=30)
    settings = GatewaySettings(
        jwt_secret=SecretStr("test-secret-0123456789abcdef0123456789"),
        volume_allow_list=["/data", "/tmp/heteroflow"],
    )
    op = await auth.issue_system_credential(store, "operator", "root")
    agent = await auth.issue_node_credential(store, AGENT_NODE)
    await auth.create_tenant(store, "acme", "Acme")
    await auth.create_tenant(store, "globex", "Globex")
    _, key = await auth.issue_api_key(store, "acme", "ci")
    _, other = await auth.issue_api_key(store, "globex", "ci")
    app = create_app(settings, store)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://gw", timeout=web.REQUEST
    ) as client:
        yield Api(client, store, bearer(op), bearer(key), bearer(other), bearer(agent), settings)
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
