"""Reserved names and foreign references over a real store: `heteroflow.` labels refused at
every entry (400, 40002, naming the key), a job settled only by the task it created, a
group's members only tasks of its tenant, and rows stored with the old labels upcast with
replay at zero differences."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import partial
from typing import Any

from prometheus_client import REGISTRY

from libs.domain.group.decide import GroupPolicy
from libs.domain.node.events import NodeRegistered
from libs.domain.node.model import NodeInventory
from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.task.decide import decide_transition
from libs.domain.task.model import Platform, TaskId, TenantId, parse_create
from libs.domain.task.states import Actor
from libs.domain.task.states import TaskStatus as S
from libs.store import groups as group_rows
from libs.store import tasks as task_rows
from libs.store.migrations import MIGRATIONS
from libs.store.projections import NODES
from libs.store.replay import rebuild
from services.job_orchestrator.service import Orchestrator
from services.scheduler.controllers.groups import GroupController
from services.scheduler.handlers.dispatch import Dispatcher

from .helpers import Api, complete

TASK = {"name": "t", "image": "busybox:latest"}
SURGE = "heteroflow.rollout_surge_cards"


def job_body() -> dict[str, Any]:
    return {
        "name": "pipe",
        "tasks": [
            {"key": "train", "name": "train", "image": "busybox:latest", "metrics": ["accuracy"]},
            {"key": "deploy", "name": "deploy", "image": "busybox:latest"},
        ],
        "dependencies": [
            {"task": "deploy", "on": "train", "kind": "condition", "condition": "accuracy > 0.9"}
        ],
    }


def refusal(r: Any, field: str) -> None:
    assert r.status_code == 400, r.text
    assert r.json()["code"] == 40002 and r.json()["fields"] == [field], r.text
    key = field.split("labels.", 1)[1]
    assert repr(key) in r.json()["error"], r.text  # the whole key, as the tenant wrote it


async def test_every_entry_refuses_the_platforms_labels(api: Api) -> None:
    """The 4-card task under a 2-card quota with the surge label, a plain task claiming a
    job, a group template, a job's task and an update: each 400 naming the key."""
    await api.client.put("/api/v1/tenants/acme", json={"gpu_quota": 2}, headers=api.operator)
    body = TASK | {"gpu_required": 4, "labels": {SURGE: "4"}}
    refusal(
        await api.client.post("/api/v1/tasks", json=body, headers=api.tenant), f"labels.{SURGE}"
    )
    body = TASK | {"labels": {"heteroflow.job": "job-x"}}
    refusal(
        await api.client.post("/api/v1/tasks", json=body, headers=api.tenant),
        "labels.heteroflow.job",
    )
    group = TASK | {"task_count": 2, "labels": {"heteroflow.static_world": "true"}}
    refusal(
        await api.client.post("/api/v1/task-groups", json=group, headers=api.tenant),
        "labels.heteroflow.static_world",
    )
    job = {"name": "j", "tasks": [{"key": "a"} | TASK | {"labels": {"heteroflow.job_key": "b"}}]}
    refusal(
        await api.client.post("/api/v1/jobs", json=job, headers=api.tenant),
        "tasks[0].labels.heteroflow.job_key",
    )
    created = await api.client.post("/api/v1/tasks", json=TASK, headers=api.tenant)
    assert created.status_code == 201, created.text
    update = {"labels": {"heteroflow.job": "job-x"}}
    refusal(
        await api.client.put(
            f"/api/v1/tasks/{created.json()['id']}", json=update, headers=api.tenant
        ),
        "labels.heteroflow.job",
    )
    owned = TASK | {"platform": {"surge_cards": 4}}
    r = await api.client.post("/api/v1/tasks", json=owned, headers=api.tenant)
    assert r.status_code == 400 and r.json()["code"] == 40002 and r.json()["fields"] == ["platform"]


def refused_count() -> float:
    value = REGISTRY.get_sample_value("heteroflow_foreign_references_total", {"kind": "job_task"})
    return value or 0.0


async def test_a_task_claiming_another_tenants_job_is_refused_and_the_job_unchanged(
    api: Api,
) -> None:
    """Tenant B's task that names A's job and node (it cannot through the API; here it is
    written as if a path had let it) ends with `accuracy 0.99`: A's `train` is not settled,
    `deploy` is not created, the refusal is counted. Nor does a task of A's own that the
    job did not create settle it. The task the job created does."""
    r = await api.client.post("/api/v1/jobs", json=job_body(), headers=api.tenant)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    train_id = r.json()["tasks"][0]["task"]["id"]
    before = [e.type for e in await api.store.read_stream(job_id)]
    status = (await api.client.get(f"/api/v1/jobs/{job_id}", headers=api.tenant)).json()["status"]
    forged_spec = parse_create(TASK, tenant=True).model_copy(
        update={"platform": Platform(job_id=job_id, job_key="train")}
    )
    orchestrator = Orchestrator(api.store)
    count = refused_count()
    for tenant in ("globex", "acme"):
        forged = await api.store.create_task(TenantId(tenant), forged_spec)
        await orchestrator.handle(
            await complete(api.store, forged.id, 'HF_METRICS {"accuracy": 0.99}')
        )
    assert refused_count() == count + 2
    assert [e.type for e in await api.store.read_stream(job_id)] == before
    view = (await api.client.get(f"/api/v1/jobs/{job_id}", headers=api.tenant)).json()
    nodes = {t["key"]: t for t in view["tasks"]}
    assert nodes["train"]["state"] == "created" and nodes["deploy"]["task"] is None
    # Unchanged, and `pending`: its one task waits for placement (no task holds resources).
    assert view["status"] == status == "pending"

    await orchestrator.handle(await complete(api.store, train_id, 'HF_METRICS {"accuracy": 0.95}'))
    view = (await api.client.get(f"/api/v1/jobs/{job_id}", headers=api.tenant)).json()
    nodes = {t["key"]: t for t in view["tasks"]}
    assert nodes["train"]["state"] == "completed" and nodes["train"]["metrics"] == {
        "accuracy": 0.95
    }
    assert nodes["deploy"]["task"] is not None
    assert refused_count() == count + 2
    assert (await rebuild(api.store, dry_run=True)).differences == {}


async def test_rows_stored_with_the_old_labels_are_upcast_and_replay_agrees(api: Api) -> None:
    """A job's task and a group written as before `platform` (labels `heteroflow.job`,
    `heteroflow.job_key`, `heteroflow.rank`, `heteroflow.static_world`, no `platform` in
    any spec, events and rows alike): migration 12 moves the labels, and replaying the
    events (upcast on load) gives the same rows."""
    r = await api.client.post("/api/v1/jobs", json=job_body(), headers=api.tenant)
    job_id, train_id = r.json()["id"], r.json()["tasks"][0]["task"]["id"]
    group = TASK | {"task_count": 2, "task_type": "training", "labels": {"team": "x"}}
    g = await api.client.post("/api/v1/task-groups", json=group, headers=api.tenant)
    assert g.status_code == 201, g.text
    old_spec = (
        "(((doc->'spec') - 'platform') || jsonb_build_object('labels', (doc->'spec'->'labels')"
        " || CASE WHEN doc->'spec'->'platform'->>'job_id' <> '' THEN jsonb_build_object("
        "'heteroflow.job', doc->'spec'->'platform'->>'job_id',"
        " 'heteroflow.job_key', doc->'spec'->'platform'->>'job_key') ELSE '{}' END"
        " || CASE WHEN doc->>'group_id' IS NOT NULL THEN jsonb_build_object("
        "'heteroflow.rank', doc->>'rank', 'heteroflow.static_world', 'true') ELSE '{}' END))"
    )
    async with api.store.pool.connection() as conn:
        # The old shape of every task_created payload and task row, of the group and job
        # documents' specs (their events parse without `platform`: it has a default). The
        # history is written as the old code wrote it, past the append-only trigger.
        await conn.execute("ALTER TABLE events DISABLE TRIGGER events_no_update")
        await conn.execute(
            f"UPDATE events SET payload = jsonb_set(payload, '{{spec}}',"
            f" {old_spec.replace('doc', 'payload')}) WHERE type = 'task_created'"
        )
        await conn.execute(f"UPDATE tasks SET doc = jsonb_set(doc, '{{spec}}', {old_spec})")
        await conn.execute("UPDATE tasks SET labels = doc->'spec'->'labels'")
        await conn.execute("UPDATE groups SET doc = doc #- '{spec,template,platform}'")
        await conn.execute(
            "UPDATE jobs SET doc = jsonb_set(doc, '{spec,tasks}', (SELECT jsonb_agg(t #-"
            " '{spec,platform}') FROM jsonb_array_elements(doc->'spec'->'tasks') t))"
        )
        await conn.execute(
            "UPDATE events SET payload = jsonb_set(payload, '{spec,tasks}', (SELECT"
            " jsonb_agg(t #- '{spec,platform}') FROM jsonb_array_elements("
            "payload->'spec'->'tasks') t)) WHERE type = 'job_submitted'"
        )
        await conn.execute("ALTER TABLE events ENABLE TRIGGER events_no_update")
        cur = await conn.execute("SELECT labels FROM tasks WHERE id = %s", [train_id])
        row = await cur.fetchone()
        assert row is not None and row[0]["heteroflow.job"] == job_id  # the old shape
        await conn.execute(dict(MIGRATIONS)[12])
    assert (await rebuild(api.store, dry_run=True)).differences == {}
    train = await api.store.get_task(TaskId(train_id))
    assert train.spec.platform == Platform(job_id=job_id, job_key="train")
    assert train.spec.labels == {}
    assert [t.id for t in await task_rows.of_job(api.store, job_id)] == [train_id]
    members = [t for t in await task_rows.of_group(api.store, g.json()["id"])]
    assert members and all(
        m.spec.platform.static_world and m.spec.labels == {"team": "x"} for m in members
    )


async def test_a_task_naming_another_tenants_group_is_no_member(api: Api) -> None:
    """Tenant B's task that names A's training group at a rank of its own (written past the
    API, which cannot create one) fails: A's group controller does not count it a member, so
    its failure fails neither the group nor A's members; the refusal is counted."""
    group = TASK | {"task_count": 2, "task_type": "training"}
    r = await api.client.post("/api/v1/task-groups", json=group, headers=api.tenant)
    assert r.status_code == 201, r.text
    gid = r.json()["id"]
    forged = await api.store.create_task(
        TenantId("globex"), parse_create(TASK, tenant=True), group_id=gid, rank=2
    )
    for to in (S.SCHEDULED, S.STARTING, S.RUNNING, S.FAILED):
        actor, code = (
            (Actor.AGENT, ReasonCode.EXITED)
            if to is S.FAILED
            else (Actor.SCHEDULER, ReasonCode.PLACED)
        )
        await api.store.execute(
            forged.id, partial(decide_transition, to=to, actor=actor, reason_code=code)
        )
    controller = GroupController(api.store, GroupPolicy(), lambda: datetime.now(UTC))
    before = REGISTRY.get_sample_value(
        "heteroflow_foreign_references_total", {"kind": "group_member"}
    )
    stored = await group_rows.get(api.store, gid)
    assert stored is not None
    events = [e.type for e in await api.store.read_stream(gid)]
    await controller.reconcile(stored)
    after = REGISTRY.get_sample_value(
        "heteroflow_foreign_references_total", {"kind": "group_member"}
    )
    now = await group_rows.get(api.store, gid)
    assert [e.type for e in await api.store.read_stream(gid)] == events
    assert now is not None and now.restarts == 0 and now.status.value == "pending", now
    members = await task_rows.of_group(api.store, gid)
    assert sorted(m.status.value for m in members if m.tenant_id == "acme") == ["pending"] * 2
    assert (after or 0) - (before or 0) == 1


async def register(api: Api, node_id: str, address: str) -> None:
    inventory = NodeInventory(memory_mb=8192, cpu_cores=4, address=address)
    events: list[Payload] = [NodeRegistered(node_id=node_id, inventory=inventory)]
    await api.store.execute_aggregate(NODES, node_id, lambda _n: events)


async def test_a_task_naming_another_tenants_group_gives_its_members_no_master(api: Api) -> None:
    """Tenant B's live task that claims rank 0 of A's training group (written past the API)
    is not rank 0 to the dispatcher: A's rank 1 gets MASTER_ADDR of A's own rank 0."""
    for node_id, address in (("n1", "10.0.0.1"), ("n2", "10.6.6.6")):
        await register(api, node_id, address)
    group = TASK | {"task_count": 2, "task_type": "training"}
    r = await api.client.post("/api/v1/task-groups", json=group, headers=api.tenant)
    assert r.status_code == 201, r.text
    members = sorted(await task_rows.of_group(api.store, r.json()["id"]), key=lambda t: t.rank or 0)
    await api.place(members[0].id, "n1")
    await api.place(members[1].id, "n1")
    forged = await api.store.create_task(
        TenantId("globex"), parse_create(TASK, tenant=True), group_id=r.json()["id"], rank=0
    )
    await api.place(forged.id, "n2")
    rank1 = await api.store.get_task(members[1].id)
    env, host_network = await Dispatcher(api.store, None).group_run(rank1)  # type: ignore[arg-type]
    assert env["MASTER_ADDR"] == "10.0.0.1" and host_network
