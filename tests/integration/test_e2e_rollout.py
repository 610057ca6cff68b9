"""Rollout pieces end to end with real busybox httpd replicas behind the router."""

from __future__ import annotations

import asyncio

import pytest

from libs.domain.rollout import decide_drain
from libs.store.eventstore import EventStore

from .cluster import Cluster
from .conftest import requires_docker
from .test_e2e_serving import call, create_group, ready_replicas, serving

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.docker, requires_docker]


def mark_draining(cluster: Cluster, task_id: str) -> None:
    async def run() -> None:
        store = await EventStore.open(cluster.database_url, max_size=2)
        try:
            await store.execute(task_id, decide_drain)
        finally:
            await store.close()

    asyncio.run(run())


def test_router_sends_nothing_new_to_a_draining_replica(cluster: Cluster) -> None:
    cluster.start_agent("sv1", "docker")
    g = create_group(cluster, task_count=2)
    cluster.wait(lambda: len(ready_replicas(cluster, g["id"])) == 2, "two ready replicas", 60)
    old, kept = sorted(ready_replicas(cluster, g["id"]))
    mark_draining(cluster, old)

    def drained() -> bool:
        return any(r["draining"] for r in serving(cluster, g["id"])["replicas"])

    cluster.wait(drained, "the router sees the draining mark", 30)
    served = set()
    for _ in range(20):
        r = call(cluster, g["id"], "index.html")
        assert r.status_code == 200, r.text
        served.add(r.headers["x-heteroflow-replica"])
    assert served == {kept}
    view = {r["task_id"]: r for r in serving(cluster, g["id"])["replicas"]}
    assert view[old]["status"] == "running" and view[old]["draining"]
