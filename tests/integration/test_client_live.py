"""The Python client against the real gateway over PostgreSQL: every resource created, read,
listed (as a page and through the iterator), updated and deleted; refusals raise with the
API's code and fields; a tenant over its write rate is answered 429 and the client's PUT goes
through after the Retry-After. Most tests run the gateway in-process (httpx.ASGITransport);
the last runs the blocking `Client` over real HTTP against a `heteroflow up`: a task, a
group, a job, a queue and a pool (the operator's token for those two) created, read, listed,
updated and deleted, a 400 raised with its code and fields, then followed logs coming line
by line while the task still runs."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from heteroflow.client import ApiError, AsyncClient, Client
from libs.config import GatewaySettings
from libs.domain.group.windows import ScheduleWindow
from libs.domain.pool.model import PoolSpec, QueueSpec
from libs.domain.task.model import TaskSpec
from libs.store.eventstore import EventStore
from services.api_gateway.app import create_app

from .cluster import Cluster
from .helpers import Api, gateway_api


def _clients(api: Api) -> tuple[AsyncClient, AsyncClient, httpx.AsyncBaseTransport]:
    """A tenant's and the operator's client over one app, and the app as a transport."""
    app = create_app(api.settings, api.store)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)

    def token(headers: dict[str, str]) -> str:
        return headers["Authorization"].removeprefix("Bearer ")

    return (
        AsyncClient("http://gw", token(api.tenant), transport=transport),
        AsyncClient("http://gw", token(api.operator), transport=transport),
        transport,
    )


async def test_task_lifecycle_through_the_client(api: Api) -> None:
    tenant, op, _ = _clients(api)
    async with tenant as c, op:
        spec = TaskSpec.model_validate({"name": "client-t", "image": "busybox:latest"})
        made = [await c.tasks.create(spec) for _ in range(3)]
        ids = {t["id"] for t in made}
        assert (await c.tasks.get(made[0]["id"]))["name"] == "client-t"

        page = await c.tasks.list(name="client-t", per_page=2)
        assert page["total"] == 3 and len(page["tasks"]) == 2
        assert {t["id"] async for t in c.tasks.iter(name="client-t", per_page=2)} == ids

        updated = await c.tasks.update(made[1]["id"], {"memory_mb": 4096})
        assert updated["memory_mb"] == 4096
        stats = await c.tasks.stats()
        assert stats["total"] == 3 and stats["by_status"]["pending"] == 3
        assert (await c.tasks.retries(made[1]["id"]))["task_id"] == made[1]["id"]
        first = await c.tasks.events(made[1]["id"])
        assert first["task_id"] == made[1]["id"]
        assert [e async for e in c.tasks.iter_events(made[1]["id"])] == first["events"]
        assert (await c.tasks.stop(made[2]["id"]))["status"] in ("cancelled", "stopped")

        await c.tasks.delete(made[0]["id"])
        with pytest.raises(ApiError) as gone:
            await c.tasks.get(made[0]["id"])
        assert gone.value.status == 404

        with pytest.raises(ApiError) as refused:
            await c.tasks.create({"name": "x", "image": "busybox:latest", "gpuz": 1})
        assert refused.value.status == 400 and refused.value.fields == ["gpuz"]
        assert refused.value.code == 40001

        planned = await c.tasks.plan({"name": "p", "image": "busybox:latest", "gpu_required": 1})
        assert (planned["kind"], planned["written"], planned["fits"]) == ("task", False, False)
        assert (await c.tasks.stats())["total"] == 2  # the plan wrote nothing
        with pytest.raises(ApiError) as unplannable:
            await c.tasks.plan({"name": "p", "image": "busybox:latest", "gpuz": 1})
        assert unplannable.value.fields == ["gpuz"]


GROUP = {"name": "web", "image": "busybox:latest", "command": "httpd -f", "task_count": 2}
JOB = {
    "name": "dag",
    "tasks": [
        {"key": "prep", "name": "prep", "image": "busybox:latest"},
        {"key": "train", "name": "train", "image": "busybox:latest"},
    ],
    "dependencies": [{"task": "train", "on": "prep"}],
}


async def test_groups_jobs_queues_pools_tenants_nodes_through_the_client(api: Api) -> None:
    tenant, op, transport = _clients(api)
    async with tenant as c, op:
        assert (await c.groups.plan(GROUP))["kind"] == "group"
        assert (await c.jobs.plan(JOB))["kind"] == "job"
        group = await c.groups.create(GROUP)
        gid = group["id"]
        assert (await c.groups.get(gid))["name"] == "web"
        assert [g["id"] async for g in c.groups.iter()] == [gid]
        assert (await c.groups.list())["total"] == 1
        assert (await c.groups.scale(gid, 3))["replicas"] == 3
        window = ScheduleWindow.model_validate(
            {"start": "22:00", "end": "06:00", "action": "scale", "scale_to": 1}
        )
        assert (await c.groups.window(gid, window))["schedule_window"]["start"] == "22:00"
        assert (await c.groups.window(gid, None))["schedule_window"] is None
        updated = await c.groups.update(gid, {"idle_timeout_minutes": 30})
        assert updated["template"]["idle_timeout_minutes"] == 30
        assert (await c.groups.stats())["total"] == 1
        timeline = await c.groups.events(gid)
        assert timeline["group_id"] == gid
        assert [e async for e in c.groups.iter_events(gid)] == timeline["events"]
        with pytest.raises(ApiError) as bad:
            await c.groups.update(gid, {"replicas": 2})
        assert bad.value.status == 400 and bad.value.fields == ["replicas"]
        await c.groups.delete(gid)
        with pytest.raises(ApiError) as gone:
            await c.groups.get(gid)
        assert gone.value.status == 404

        job = await c.jobs.create(JOB)
        assert (await c.jobs.get(job["id"]))["name"] == "dag"
        assert [j["id"] async for j in c.jobs.iter()] == [job["id"]]
        assert (await c.jobs.events(job["id"]))["events"][0]["type"] == "job_submitted"
        assert (await c.jobs.stop(job["id"]))["id"] == job["id"]
        kinds = [e["type"] for e in (await c.jobs.events(job["id"]))["events"]]
        assert "job_stop_requested" in kinds
        await c.jobs.delete(job["id"])
        with pytest.raises(ApiError):
            await c.jobs.get(job["id"])

        pool = PoolSpec.model_validate({"name": "a100", "node_selector": {"gpu_type": "A100"}})
        assert (await op.pools.create(pool))["name"] == "a100"
        queue = QueueSpec.model_validate(
            {"name": "alg", "tenant": "acme", "pools": ["a100"], "quota": {"max_gpus": 4}}
        )
        assert (await op.queues.create(queue))["quota"]["max_gpus"] == 4
        with pytest.raises(ApiError) as taken:
            await op.queues.create(queue)
        assert taken.value.status == 409
        assert [q["name"] async for q in c.queues.iter()] == ["alg"]
        assert (await c.queues.get("alg"))["pools"] == ["a100"]
        moved = await op.queues.update("alg", queue.model_dump() | {"quota": {"max_gpus": 8}})
        assert moved["quota"]["max_gpus"] == 8
        h100 = {"node_selector": {"gpu_type": "H100"}}
        assert (await op.pools.update("a100", h100))["node_selector"]["gpu_type"] == "H100"
        assert [p["name"] async for p in op.pools.iter()] == ["a100"]
        assert (await op.pools.get("a100"))["name"] == "a100"
        await op.queues.delete("alg")
        await op.pools.delete("a100")
        assert [p async for p in op.pools.iter()] == []
        with pytest.raises(ApiError) as forbidden:
            await c.pools.create({"name": "mine", "node_selector": {}})
        assert forbidden.value.status == 403

        assert (await op.tenants.create({"id": "initech", "gpu_quota": 4}))["id"] == "initech"
        assert (await op.tenants.update("initech", {"gpu_quota": 8}))["gpu_quota"] == 8
        tenants = {t["id"] for t in (await op.tenants.list())["tenants"]}
        assert {"acme", "globex", "initech"} <= tenants
        key = (await op.tenants.create_api_key("initech", "ci"))["key"]
        assert [k["name"] for k in (await op.tenants.api_keys("initech"))["api_keys"]] == ["ci"]
        async with AsyncClient("http://gw", key, transport=transport) as initech:
            assert (await initech.tasks.list())["total"] == 0

        assert (await op.nodes.register("n9"))["agent_token"]
        join = (await op.nodes.join_token(ttl_s=60))["join_token"]
        async with AsyncClient("http://gw", join, transport=transport) as joining:
            assert (await joining.nodes.join("n10"))["node_id"] == "n10"
        assert "nodes" in await op.nodes.list()
        with pytest.raises(ApiError) as no_node:
            await op.nodes.get("ghost")
        assert no_node.value.status == 404
        assert (await c.ready())["checks"]["postgres"] == "ok"


@pytest.fixture
async def throttled(database_url: str) -> AsyncIterator[Api]:
    """A gateway whose tenants may write once a second (a burst of 1)."""
    store = await EventStore.open(database_url, max_size=10)
    settings = GatewaySettings(
        jwt_secret=SecretStr("test-secret-0123456789abcdef0123456789"),
        tenant_write_rate_per_s=1.0,
        tenant_write_burst=1,
    )
    try:
        async with gateway_api(store, settings) as api:
            yield api
    finally:
        await store.close()


async def test_a_429_is_retried_after_its_retry_after(throttled: Api) -> None:
    waited: list[float] = []

    async def sleep(s: float) -> None:
        waited.append(s)
        await asyncio.sleep(s)

    app = create_app(throttled.settings, throttled.store)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    token = throttled.tenant["Authorization"].removeprefix("Bearer ")
    async with AsyncClient("http://gw", token, transport=transport, sleep=sleep) as c:
        task = await c.tasks.create({"name": "r", "image": "busybox:latest"})  # the one token
        with pytest.raises(ApiError) as refused:  # a POST is not retried: the 429 is raised
            await c.tasks.create({"name": "r2", "image": "busybox:latest"})
        assert refused.value.status == 429 and refused.value.retry_after == 1.0
        assert waited == []
        # A PUT is: answered 429 with Retry-After 1, then accepted once the bucket refilled.
        assert (await c.tasks.update(task["id"], {"memory_mb": 2048}))["memory_mb"] == 2048
    assert waited == [1.0]


def _every_resource_over_http(c: Client, op: Client) -> None:
    """Each kind created, read, listed (a page and the iterator), updated and deleted by the
    blocking client over real HTTP; no node is up yet, so nothing is placed meanwhile."""
    made = [c.tasks.create({"name": "crud", "image": "busybox:latest"}) for _ in range(3)]
    tid = made[0]["id"]
    assert c.tasks.get(tid)["name"] == "crud"
    page = c.tasks.list(name="crud", per_page=2)
    assert page["total"] == 3 and len(page["tasks"]) == 2
    assert {t["id"] for t in c.tasks.iter(name="crud", per_page=2)} == {t["id"] for t in made}
    assert c.tasks.update(tid, {"memory_mb": 4096})["memory_mb"] == 4096
    assert c.tasks.get(tid)["memory_mb"] == 4096
    with pytest.raises(ApiError) as refused:
        c.tasks.create({"name": "x", "image": "busybox:latest", "gpuz": 1})
    assert (refused.value.status, refused.value.code) == (400, 40001)
    assert refused.value.fields == ["gpuz"]
    for task in made:
        c.tasks.delete(task["id"])
    with pytest.raises(ApiError) as gone:
        c.tasks.get(tid)
    assert gone.value.status == 404
    assert c.tasks.list(name="crud")["total"] == 0

    gid = c.groups.create(GROUP)["id"]
    assert c.groups.get(gid)["name"] == "web"
    assert c.groups.list()["total"] == 1
    assert [g["id"] for g in c.groups.iter(per_page=1)] == [gid]
    assert (
        c.groups.update(gid, {"idle_timeout_minutes": 30})["template"]["idle_timeout_minutes"] == 30
    )
    assert c.groups.scale(gid, 3)["replicas"] == 3
    c.groups.delete(gid)
    with pytest.raises(ApiError) as gone:
        c.groups.get(gid)
    assert gone.value.status == 404

    jid = c.jobs.create(JOB)["id"]
    assert c.jobs.get(jid)["name"] == "dag"
    assert c.jobs.list()["total"] == 1
    assert [j["id"] for j in c.jobs.iter(per_page=1)] == [jid]
    assert c.jobs.stop(jid)["id"] == jid
    assert "job_stop_requested" in [e["type"] for e in c.jobs.events(jid)["events"]]
    c.jobs.delete(jid)
    with pytest.raises(ApiError) as gone:
        c.jobs.get(jid)
    assert gone.value.status == 404

    pool = {"name": "a100", "node_selector": {"gpu_type": "A100"}}
    assert op.pools.create(pool)["name"] == "a100"
    queue = {"name": "alg", "tenant": "default", "pools": ["a100"], "quota": {"max_gpus": 4}}
    assert op.queues.create(queue)["quota"]["max_gpus"] == 4
    assert c.queues.get("alg")["pools"] == ["a100"]
    assert [q["name"] for q in c.queues.list()["queues"]] == ["alg"]
    assert [q["name"] for q in c.queues.iter()] == ["alg"]
    assert op.queues.update("alg", queue | {"quota": {"max_gpus": 8}})["quota"]["max_gpus"] == 8
    assert c.queues.get("alg")["quota"]["max_gpus"] == 8
    h100 = {"node_selector": {"gpu_type": "H100"}}
    assert op.pools.update("a100", h100)["node_selector"]["gpu_type"] == "H100"
    assert op.pools.get("a100")["node_selector"]["gpu_type"] == "H100"
    assert [p["name"] for p in op.pools.list()["pools"]] == ["a100"]
    assert [p["name"] for p in op.pools.iter()] == ["a100"]
    op.queues.delete("alg")
    op.pools.delete("a100")
    assert list(op.queues.iter()) == [] and list(op.pools.iter()) == []
    with pytest.raises(ApiError) as gone:
        op.pools.get("a100")
    assert gone.value.status == 404


def test_every_resource_over_http_then_followed_logs(cluster: Cluster) -> None:
    op = Client(cluster.url, cluster.creds["operator_token"])
    with op, Client(cluster.url, cluster.creds["tenant_api_key"]) as c:
        _every_resource_over_http(c, op)
    cluster.start_agent("n1", "process")
    gate = Path(tempfile.mkdtemp(prefix="hf-client-gate-")) / "go"
    command = f"echo one; while [ ! -e {gate} ]; do sleep 0.1; done; echo two"
    with Client(cluster.url, cluster.creds["tenant_api_key"]) as c:
        task = c.tasks.create({"name": "follow", "image": "busybox:latest", "command": command})
        cluster.wait_status(task["id"], "running")  # logs exist once the task is placed
        lines = c.tasks.follow_logs(task["id"])
        # The first line arrives while the task is still held at the gate: it was not
        # buffered until the end.
        assert next(lines) == "one"
        assert c.tasks.get(task["id"])["status"] == "running"
        gate.touch()
        assert list(lines) == ["two"]  # then the stream ends with the task
        assert c.tasks.get(task["id"])["status"] == "completed"
        assert c.tasks.logs(task["id"], lines=1)["logs"] == ["two"]
