"""Queues and resource pools end to end on nodes with declared cards (seed 004): two queues
share one pool, a queue's max_gpus and max_running_jobs hold, work stays inside its pool, and a
pending task's reason names what blocked it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg

from tests.wait import wait_until

from . import web
from .cluster import Cluster

GB = 1024


def post(cluster: Cluster, path: str, body: dict[str, Any], expect: int = 201) -> dict[str, Any]:
    r = web.post(f"{cluster.url}/api/v1/{path}", json=body, headers=cluster.operator)
    assert r.status_code == expect, r.text
    return dict(r.json())


def get(cluster: Cluster, path: str) -> dict[str, Any]:
    r = web.get(f"{cluster.url}/api/v1/{path}", headers=cluster.operator)
    assert r.status_code == 200, r.text
    return dict(r.json())


def submit(cluster: Cluster, queue: str, n: int, *, seconds: int) -> list[str]:
    return [
        cluster.create(
            name=f"{queue}-{i}", gpu_required=1, queue=queue, command=f"sleep {seconds}"
        )["id"]
        for i in range(n)
    ]


def start_fleet(cluster: Cluster) -> None:
    """Three process nodes with declared (simulated) cards: two A100 nodes labelled for
    training, one H100 node outside the pool."""
    a100 = json.dumps({"pool": "train"})
    for node in ("a1", "a2"):
        cluster.start_agent(
            node,
            "process",
            HETEROFLOW_DECLARED_GPUS=f"nvidia:A100-80GB:{80 * GB}x4",
            HETEROFLOW_NODE_LABELS=a100,
            HETEROFLOW_NODE_CPU_CORES="16",
        )
    cluster.start_agent(
        "h1",
        "process",
        HETEROFLOW_DECLARED_GPUS=f"nvidia:H100:{80 * GB}x4",
        HETEROFLOW_NODE_CPU_CORES="16",
    )


def get_job(cluster: Cluster, job_id: str) -> dict[str, Any]:
    r = web.get(f"{cluster.url}/api/v1/jobs/{job_id}", headers=cluster.tenant)
    assert r.status_code == 200, r.text
    return dict(r.json())


def wait_for(
    cluster: Cluster, ids: list[str], cond: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    """Poll the tasks until `cond` holds; on timeout say where each one is."""
    now: list[dict[str, Any]] = []

    def holds() -> list[dict[str, Any]] | None:
        now[:] = [cluster.task(i) for i in ids]
        return list(now) if cond(now) else None

    def where() -> str:
        return str([(t["name"], t["status"], t["node_id"], t["pending_reason"]) for t in now])

    return wait_until(holds, 60, 0.2, where)


def holding_intervals(cluster: Cluster, ids: list[str]) -> list[tuple[float, float]]:
    """(first scheduled, terminal) of each task, from its events."""
    out = []
    with psycopg.connect(cluster.database_url) as conn:
        for task_id in ids:
            rows = conn.execute(
                "SELECT payload->>'to_status', extract(epoch FROM occurred_at) FROM events"
                " WHERE stream_id = %s AND type = 'task_status_changed' ORDER BY version",
                (task_id,),
            ).fetchall()
            start = next(float(t) for s, t in rows if s == "scheduled")
            end = next(float(t) for s, t in rows if s in ("completed", "failed"))
            out.append((start, end))
    return sorted(out)


def test_two_queues_on_one_pool(cluster: Cluster) -> None:
    start_fleet(cluster)
    pool = post(
        cluster,
        "pools",
        {"name": "a100", "node_selector": {"gpu_type": "A100", "labels": {"pool": "train"}}},
    )
    assert pool["capacity"]["total_gpus"] == 8
    assert sorted(n["id"] for n in pool["nodes"]) == ["a1", "a2"]
    post(
        cluster,
        "queues",
        {"name": "x", "tenant": "default", "pools": ["a100"], "quota": {"max_gpus": 4}},
    )
    post(cluster, "queues", {"name": "y", "tenant": "default", "pools": ["a100"]})

    refused = web.post(
        f"{cluster.url}/api/v1/tasks",
        json={"name": "big", "image": "busybox:latest", "gpu_required": 5, "queue": "x"},
        headers=cluster.tenant,
    )
    assert refused.status_code == 400
    assert refused.json()["code"] == 40003 and "max_gpus 4" in refused.json()["error"]

    xs = submit(cluster, "x", 6, seconds=600)
    ys = submit(cluster, "y", 6, seconds=600)

    def tasks(ids: list[str]) -> list[dict[str, Any]]:
        return [cluster.task(i) for i in ids]

    wait_for(cluster, xs + ys, lambda ts: sum(t["status"] == "running" for t in ts) == 8)
    x_now, y_now = tasks(xs), tasks(ys)
    assert sum(t["status"] == "running" for t in x_now) == 4
    assert sum(t["status"] == "running" for t in y_now) == 4
    assert {t["node_id"] for t in x_now + y_now if t["node_id"]} == {"a1", "a2"}
    cluster.wait(
        lambda: all(t["pending_reason"] for t in tasks(xs + ys) if t["status"] == "pending"),
        "reasons on the pending tasks",
    )
    codes = {t["pending_reason_code"] for t in tasks(xs) if t["status"] == "pending"}
    assert codes == {"queue_quota_exceeded"}
    y_pending = [t for t in tasks(ys) if t["status"] == "pending"]
    assert {t["pending_reason_code"] for t in y_pending} == {"pool_capacity"}
    assert "pool(s) a100 of queue 'y' full" in y_pending[0]["pending_reason"]

    x = get(cluster, "queues/x")
    assert x["usage"] == {"gpus": 4.0, "running_tasks": 4, "running_jobs": 4}
    assert x["pending"] == 2
    assert get(cluster, "pools/a100")["capacity"]["free_gpus"] == 0


def test_a_queue_with_one_running_job_runs_them_one_at_a_time(cluster: Cluster) -> None:
    start_fleet(cluster)
    post(cluster, "pools", {"name": "all", "node_selector": {}})
    post(
        cluster,
        "queues",
        {
            "name": "serial",
            "tenant": "default",
            "pools": ["all"],
            "quota": {"max_running_jobs": 1},
            "default": True,
        },
    )
    # No `queue` field: the tenant's default queue takes them.
    ids = [cluster.create(name=f"s{i}", gpu_required=1, command="sleep 1")["id"] for i in range(3)]
    assert {cluster.task(i)["queue"] for i in ids} == {"serial"}
    for task_id in ids:
        cluster.wait_status(task_id, "completed", timeout=60)
    spans = holding_intervals(cluster, ids)
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert start >= end, spans

    # Jobs: each job's two tasks may run together, but never beside the other job's.
    pair = {
        "tasks": [
            {
                "key": k,
                "name": k,
                "image": "busybox:latest",
                "command": "sleep 1",
                "gpu_required": 1,
            }
            for k in ("p", "q")
        ]
    }
    jobs = []
    for name in ("j1", "j2"):
        r = web.post(
            f"{cluster.url}/api/v1/jobs", json=pair | {"name": name}, headers=cluster.tenant
        )
        assert r.status_code == 201, r.text
        jobs.append(r.json()["id"])
    by_job = []
    for job_id in jobs:

        def succeeded(j: str = job_id) -> bool:
            return bool(get_job(cluster, j)["status"] == "succeeded")

        cluster.wait(succeeded, f"{job_id} done", 60)
        by_job.append([t["task"]["id"] for t in get_job(cluster, job_id)["tasks"]])
    first, second = sorted((holding_intervals(cluster, ids) for ids in by_job), key=min)
    assert max(end for _, end in first) <= min(start for start, _ in second), (first, second)
