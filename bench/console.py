"""The console suite: page loads for a tenant with many tasks (issue target: < 300 ms).

`heteroflow service api-gateway` runs in a child process as in the gateway suites; the
tenant gets `--console-tasks` tasks (10,000 by default) written through the store in batches,
one of them timed out so its detail page has a timeline. Then each page is fetched
`--console-loads` times over HTTP with the session cookie, one after the other, and the p50
and p99 of the whole answer's time are reported: the first page of the list, a later page,
a filtered list, a task's detail page (the task, its timeline and its attempts), a group's
page (the group, its serving, rollout and timeline), a job's page (its DAG drawn) and pools.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import httpx

from libs import auth
from libs.domain.task.model import TaskSpec, TenantId
from libs.store.eventstore import EventStore

from . import Context
from .gateway_load import GatewayLoad, _free_port, _start, _stop, _wait_ready, percentile
from .report import Row, target

DESCRIPTION = "console page loads (list, later page, filter, detail) for a tenant with 10k tasks"

TENANT = "bench-console"
BATCH = 500
TARGET_MS = 300.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("console")
    group.add_argument(
        "--console-tasks", type=int, default=10_000, help="tasks of the tenant (default 10000)"
    )
    group.add_argument(
        "--console-loads", type=int, default=50, help="loads of each page (default 50)"
    )


async def _seed(store: EventStore, n: int) -> str:
    spec = TaskSpec(name="bench", image="busybox:latest", command="true")
    first = ""
    for start in range(0, n, BATCH):
        items = [(TenantId(TENANT), spec, None, None)] * min(BATCH, n - start)
        tasks = await store.create_tasks(items)
        first = first or tasks[0].id
    return first


async def run(ctx: Context) -> list[Row]:
    args = ctx.args
    with ctx.database() as url:
        store = await EventStore.open(url, max_size=2)
        try:
            await auth.create_tenant(store, TENANT, "bench")
            _, key = await auth.issue_api_key(store, TENANT, "bench")
            task_id = await _seed(store, args.console_tasks)
            port, probe = _free_port(), _free_port()
            load = GatewayLoad(url, ctx.servers.nats_url, key, 0.0, 0.0, 1, 1)
            pages = {
                "tasks_first_page": "/ui/tasks",
                "tasks_page_100": "/ui/tasks?page=100",
                "tasks_filtered": "/ui/tasks?status=pending&name=bench",
                "task_detail": f"/ui/tasks/{task_id}",
            }
            rows: list[Row] = [Row("console.tasks", args.console_tasks, "tasks")]
            with tempfile.TemporaryDirectory(prefix="hf-bench-console-") as home:
                proc = await _start(load, port, probe, home)
                try:
                    await _wait_ready(probe, proc)
                    async with httpx.AsyncClient(
                        base_url=f"http://127.0.0.1:{port}", timeout=10.0
                    ) as client:
                        r = await client.post(
                            "/ui/login",
                            content=f"key={key}",
                            headers={"content-type": "application/x-www-form-urlencoded"},
                        )
                        assert r.status_code == 303, r.text
                        pages |= await _group_and_job(client, key)
                        for name, path in pages.items():
                            rows += await _loads(client, name, path, args.console_loads)
                finally:
                    await _stop(proc)
            return rows
        finally:
            await store.close()


async def _group_and_job(client: httpx.AsyncClient, key: str) -> dict[str, str]:
    """A group of 3 and a job of 3 tasks (a chain) through the API: their pages, and pools."""
    auth_header = {"Authorization": f"Bearer {key}"}
    member = {"image": "busybox:latest", "command": "true"}
    r = await client.post(
        "/api/v1/task-groups",
        json=member | {"name": "bench", "task_count": 3},
        headers=auth_header,
    )
    assert r.status_code == 201, r.text
    group_id = r.json()["id"]
    job = {
        "name": "bench",
        "tasks": [member | {"key": k, "name": k} for k in ("a", "b", "c")],
        "dependencies": [{"task": "b", "on": "a"}, {"task": "c", "on": "b"}],
    }
    r = await client.post("/api/v1/jobs", json=job, headers=auth_header)
    assert r.status_code == 201, r.text
    return {
        "group_detail": f"/ui/groups/{group_id}",
        "job_detail": f"/ui/jobs/{r.json()['id']}",
        "pools": "/ui/pools",
    }


async def _loads(client: httpx.AsyncClient, name: str, path: str, n: int) -> list[Row]:
    times: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = await client.get(path)
        times.append((time.perf_counter() - t0) * 1000)
        assert r.status_code == 200, (path, r.status_code, r.text[:200])
    times.sort()
    p99 = percentile(times, 99)
    return [
        Row(f"console.{name}_p50", percentile(times, 50), "ms"),
        Row(f"console.{name}_p99", p99, "ms"),
        target(f"console.{name}_p99", p99, TARGET_MS, "ms", lower_is_better=True),
    ]
