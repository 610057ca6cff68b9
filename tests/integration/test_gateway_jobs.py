"""`/jobs` over a real store: one refusal naming every problem, the queue's quota at
submission, the DAG view, stop and delete, tenant isolation, and replay."""

from __future__ import annotations

from typing import Any

from libs.store import tasks as task_rows
from libs.store.replay import rebuild
from services.job_orchestrator.service import Orchestrator

from .helpers import Api, complete


def body(**extra: Any) -> dict[str, Any]:
    return {
        "name": "pipe",
        "tasks": [
            {"key": "prep", "name": "prep", "image": "busybox:latest"},
            {"key": "train", "name": "train", "image": "busybox:latest", "gpu_required": 2},
            {"key": "eval", "name": "eval", "image": "busybox:latest"},
        ],
        "dependencies": [{"task": "train", "on": "prep"}, {"task": "eval", "on": "train"}],
    } | extra


async def test_one_refusal_names_every_problem(api: Api) -> None:
    bad = body(
        colour="red",
        queue="nowhere",
        dependencies=[
            {"task": "train", "on": "prep"},
            {"task": "prep", "on": "eval"},
            {"task": "eval", "on": "train"},
            {"task": "eval", "on": "ghost"},
            {"task": "eval", "on": "prep", "kind": "condition", "condition": "acc > 1"},
        ],
    )
    r = await api.client.post("/api/v1/jobs", json=bad, headers=api.tenant)
    assert r.status_code == 400
    error = r.json()["error"]
    for needle in (
        "colour: unknown field",
        "unknown task key 'ghost'",
        "task 'prep' declares no metrics",
        "cycle: prep -> train -> eval -> prep",
        "queue: unknown queue 'nowhere'",
    ):
        assert needle in error, error
    assert r.json()["code"] == 40003


async def test_a_request_over_the_queue_quota_is_refused(api: Api) -> None:
    await api.client.post(
        "/api/v1/pools", json={"name": "p", "node_selector": {}}, headers=api.operator
    )
    queue = {"name": "small", "tenant": "acme", "pools": ["p"], "quota": {"max_gpus": 1}}
    await api.client.post("/api/v1/queues", json=queue, headers=api.operator)
    r = await api.client.post("/api/v1/jobs", json=body(queue="small"), headers=api.tenant)
    assert r.status_code == 400
    assert r.json()["fields"] == ["tasks[1].gpu_required"]
    assert "over queue 'small' quota max_gpus 1" in r.json()["error"]


async def test_dag_view_stop_delete_and_replay(api: Api) -> None:
    r = await api.client.post("/api/v1/jobs", json=body(), headers=api.tenant)
    assert r.status_code == 201, r.text
    job = r.json()
    # Created, not yet placed: no task holds resources, so the job waits.
    assert (job["status"], job["reason_code"]) == ("pending", "submitted")
    assert job["reason"] == "task(s) prep waiting for placement"
    view = {t["key"]: t for t in job["tasks"]}
    assert view["prep"]["task"]["status"] == "pending" and view["train"]["task"] is None
    assert view["eval"]["why"] == "waiting for 'train' to complete"
    assert view["eval"]["depends_on"] == [{"task": "eval", "on": "train"}]

    hidden = await api.client.get(f"/api/v1/jobs/{job['id']}", headers=api.other_tenant)
    assert hidden.status_code == 404
    listed = await api.client.get("/api/v1/jobs", headers=api.tenant)
    assert [j["id"] for j in listed.json()["jobs"]] == [job["id"]]

    stopped = await api.client.post(f"/api/v1/jobs/{job['id']}/stop", headers=api.tenant)
    assert stopped.status_code == 200, stopped.text
    nodes = {t["key"]: t for t in stopped.json()["tasks"]}
    assert nodes["prep"]["task"]["status"] == "cancelled"
    assert nodes["train"]["status"] == "skipped" and nodes["eval"]["status"] == "skipped"
    assert (await rebuild(api.store, dry_run=True)).differences == {}

    gone = await api.client.delete(f"/api/v1/jobs/{job['id']}", headers=api.tenant)
    assert gone.status_code == 200
    after = await api.client.get(f"/api/v1/jobs/{job['id']}", headers=api.tenant)
    assert after.status_code == 404
    assert (await rebuild(api.store, dry_run=True)).differences == {}


async def test_the_cascade_runs_once_per_event(api: Api) -> None:
    """A final task event settles its job task and creates the dependant, in one transaction
    with the orchestrator's receipt: the same event delivered again changes nothing."""
    r = await api.client.post("/api/v1/jobs", json=body(), headers=api.tenant)
    job_id = r.json()["id"]
    prep_id = r.json()["tasks"][0]["task"]["id"]
    envelope = await complete(api.store, prep_id, 'HF_METRICS {"rows": 12}')
    orchestrator = Orchestrator(api.store)
    await orchestrator.handle(envelope)
    await orchestrator.handle(envelope)  # redelivered
    view = (await api.client.get(f"/api/v1/jobs/{job_id}", headers=api.tenant)).json()
    nodes = {t["key"]: t for t in view["tasks"]}
    assert nodes["prep"]["state"] == "completed" and nodes["prep"]["metrics"] == {"rows": 12}
    assert nodes["train"]["task"]["status"] == "pending"
    assert len(await task_rows.of_job(api.store, job_id)) == 2  # prep and train, once
    types = [e.type for e in await api.store.read_stream(job_id)]
    assert types.count("job_node_settled") == 1 and types.count("job_tasks_ready") == 2


async def test_the_orchestrator_reads_a_tasks_job_once(api: Api) -> None:
    """Which job a task belongs to is one field read, once per task: a plain task's events
    cost no read of its document, and are not a job's (no job stream is touched)."""
    r = await api.client.post("/api/v1/jobs", json=body(), headers=api.tenant)
    job_id = r.json()["id"]
    prep_id = r.json()["tasks"][0]["task"]["id"]
    r = await api.client.post(
        "/api/v1/tasks", json={"name": "plain", "command": "true"}, headers=api.tenant
    )
    plain_id = r.json()["id"]
    assert await task_rows.job_of(api.store, prep_id) == job_id
    assert await task_rows.job_of(api.store, plain_id) == ""
    assert await task_rows.job_of(api.store, "task-nosuchtask") is None

    orchestrator = Orchestrator(api.store, kept=2)
    assert await orchestrator.in_a_job(prep_id) and not await orchestrator.in_a_job(plain_id)
    assert not await orchestrator.in_a_job("task-nosuchtask")  # not remembered: may come
    assert dict(orchestrator._job_of) == {prep_id: job_id, plain_id: ""}
    before = [e.type for e in await api.store.read_stream(job_id)]
    await orchestrator.handle(await complete(api.store, plain_id, "done"))
    assert [e.type for e in await api.store.read_stream(job_id)] == before
    await orchestrator.handle(await complete(api.store, prep_id, "done"))
    assert "job_node_settled" in [e.type for e in await api.store.read_stream(job_id)]
    r = await api.client.post(
        "/api/v1/tasks", json={"name": "third", "command": "true"}, headers=api.tenant
    )
    assert not await orchestrator.in_a_job(r.json()["id"])
    assert len(orchestrator._job_of) == 2, "kept to its bound, the oldest dropped"
