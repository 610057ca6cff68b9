"""Reserved names: label keys under `heteroflow.` are the platform's, refused on every entry a
tenant reaches (40002 naming the key); the platform's own metadata lives in the spec's
server-owned `platform`, and specs stored with the old labels are upcast on load."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from libs.domain.errors import Code, DomainError
from libs.domain.group.model import parse_group
from libs.domain.job.decide import task_spec
from libs.domain.job.events import JobSubmitted
from libs.domain.job.evolve import evolve_job
from libs.domain.job.model import Job, JobNode
from libs.domain.job.spec import parse_job
from libs.domain.rollout.decide import parse_rollout
from libs.domain.task.events import TaskCreated
from libs.domain.task.evolve import evolve_task
from libs.domain.task.model import (
    Platform,
    Task,
    TaskId,
    TaskSpec,
    TenantId,
    parse_create,
    parse_update,
    upcast_spec,
)
from libs.ownership import foreign_job_task
from services.retry_engine.decide import is_static_world_member
from services.scheduler.placement.model import PendingTask

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TASK = {"name": "t", "image": "busybox:latest"}


def refused(call: Any, *args: Any, **kw: Any) -> DomainError:
    with pytest.raises(DomainError) as exc:
        call(*args, **kw)
    return exc.value


@pytest.mark.parametrize(
    "key",
    [
        "heteroflow.rollout_surge_cards",
        "heteroflow.job",
        "heteroflow.job_key",
        "heteroflow.static_world",
        "heteroflow.rank",
        "heteroflow.window.action",
        "HeteroFlow.Job",  # compared case-insensitively
        "heteroflow.anything-new",
    ],
)
def test_a_task_may_not_carry_a_reserved_label(key: str) -> None:
    err = refused(parse_create, TASK | {"labels": {"team": "a", key: "4"}}, tenant=True)
    assert err.code is Code.SERVER_OWNED_FIELD
    assert err.fields == [f"labels.{key}"] and repr(key) in err.message


def test_labels_outside_the_namespace_are_the_tenants() -> None:
    spec = parse_create(
        TASK | {"labels": {"heteroflowjob": "x", "app.heteroflow.x": "y"}}, tenant=True
    )
    assert spec.labels == {"heteroflowjob": "x", "app.heteroflow.x": "y"}
    assert spec.platform == Platform()


def test_platform_is_server_owned() -> None:
    err = refused(parse_create, TASK | {"platform": {"job_id": "job-a"}}, tenant=True)
    assert err.code is Code.SERVER_OWNED_FIELD and err.fields == ["platform"]


def test_group_templates_refuse_reserved_labels() -> None:
    raw = TASK | {"task_count": 2, "labels": {"heteroflow.static_world": "false"}}
    err = refused(parse_group, raw, tenant=True)
    assert err.code is Code.SERVER_OWNED_FIELD
    assert err.fields == ["labels.heteroflow.static_world"]


def test_job_tasks_refuse_reserved_labels() -> None:
    raw = {"name": "j", "tasks": [{"key": "a"} | TASK | {"labels": {"heteroflow.job": "job-x"}}]}
    err = refused(parse_job, raw, tenant=True)
    assert err.code is Code.SERVER_OWNED_FIELD
    assert err.fields == ["tasks[0].labels.heteroflow.job"]
    assert "heteroflow.job" in err.message


def test_an_update_may_not_add_a_reserved_label_and_keeps_the_platforms_fields() -> None:
    spec = parse_create(TASK, tenant=True).model_copy(
        update={"platform": Platform(job_id="job-a", job_key="train")}
    )
    task = Task(id=TaskId("t1"), tenant_id=TenantId("a"), spec=spec, created_at=T0, updated_at=T0)
    err = refused(parse_update, task, {"labels": {"heteroflow.job": "job-b"}}, tenant=True)
    assert err.code is Code.SERVER_OWNED_FIELD and err.fields == ["labels.heteroflow.job"]
    new, changes = parse_update(task, {"labels": {"team": "b"}}, tenant=True)
    assert new.platform == spec.platform and changes == {"labels": {"team": "b"}}


def test_a_rollout_cannot_set_labels() -> None:
    group = parse_group(TASK | {"task_count": 2}, tenant=True)
    err = refused(parse_rollout, {"image": "x:2", "labels": {"heteroflow.job": "j"}}, group)
    assert err.code is Code.UNKNOWN_FIELD and err.fields == ["labels"]


def job_a() -> Job:
    """Tenant a's job `job-a` of one task, key `k`, as submitted."""
    spec = parse_job({"name": "j", "tasks": [{"key": "k"} | TASK]}, tenant=True)
    return evolve_job(None, JobSubmitted(job_id="job-a", tenant_id=TenantId("a"), spec=spec), T0, 1)


def test_the_platform_writes_its_metadata_to_platform_not_labels() -> None:
    group = parse_group(TASK | {"task_count": 2, "task_type": "training"}, tenant=True)
    member = group.member_spec(1)
    assert member.labels == {} and member.platform.static_world
    job = job_a()
    spec = task_spec(job, "k")
    assert spec.labels == {} and spec.platform == Platform(job_id="job-a", job_key="k")


def task_of(spec: TaskSpec, group_id: str | None = None, tenant: str = "a") -> Task:
    return Task(
        id=TaskId("t1"),
        tenant_id=TenantId(tenant),
        spec=spec,
        group_id=group_id,
        rank=0 if group_id else None,
        created_at=T0,
        updated_at=T0,
    )


def test_readers_take_the_platforms_fields_and_ignore_labels() -> None:
    """A spec that still held the old labels (built in code, never accepted at entry) gives
    no job, no surge allowance and no static world: only `platform` does."""
    labels = {
        "heteroflow.job": "job-a",
        "heteroflow.rollout_surge_cards": "4",
        "heteroflow.static_world": "true",
    }
    spec = TaskSpec(name="t", image="x", gpu_required=4, labels=labels)
    plain = task_of(spec, group_id="g")
    pending = PendingTask.from_task(plain)
    assert pending.job == "" and pending.surge_cards == 0
    assert not is_static_world_member(plain)
    marked = spec.model_copy(
        update={"platform": Platform(job_id="job-a", surge_cards=4, static_world=True)}
    )
    pending = PendingTask.from_task(task_of(marked, group_id="g"))
    assert pending.job == "job-a" and pending.surge_cards == 4
    assert is_static_world_member(task_of(marked, group_id="g"))


LEGACY = {
    "heteroflow.job": "job-a",
    "heteroflow.job_key": "train",
    "heteroflow.rollout_surge_cards": "4",
    "heteroflow.static_world": "true",
    "heteroflow.rank": "0",
    "team": "x",
}


@pytest.mark.parametrize(
    ("group_id", "surge", "static"), [("grp-1", 4.0, True), (None, 0.0, False)]
)
def test_stored_events_and_documents_are_upcast(
    group_id: str | None, surge: float, static: bool
) -> None:
    """A `task_created` written before `platform`, and a projection document of that time:
    the labels move into `platform` (a surge or a static world only on a group member, the
    only kind they were written for)."""
    old_spec = {"name": "t", "image": "x", "labels": dict(LEGACY)}
    payload = {"task_id": "t1", "tenant_id": "a", "spec": old_spec, "group_id": group_id}
    event = TaskCreated.model_validate(payload)
    want = Platform(job_id="job-a", job_key="train", surge_cards=surge, static_world=static)
    assert event.spec.platform == want and event.spec.labels == {"team": "x"}
    task = evolve_task(None, event, T0, 1)
    doc = task.model_dump(mode="json")
    doc["spec"] = old_spec
    assert Task.model_validate(doc) == task
    assert (
        upcast_spec({"name": "t", "labels": {"heteroflow.rollout_surge_cards": "x"}}, grouped=True)[
            "platform"
        ]["surge_cards"]
        == 0.0
    )


def test_only_the_task_the_job_created_settles_its_node() -> None:
    job = job_a()
    spec = task_spec(job, "k")
    ours = task_of(spec)
    node = JobNode(key="k", task_id="t1")
    assert foreign_job_task(job, node, ours) == ""
    assert "another tenant" in foreign_job_task(job, node, task_of(spec, tenant="b"))
    other = ours.model_copy(update={"id": TaskId("t2")})
    assert "created t1" in foreign_job_task(job, node, other)
    # A node created before ids were kept: a task of the job's tenant only.
    assert foreign_job_task(job, JobNode(key="k"), other) == ""
    assert foreign_job_task(job, JobNode(key="k"), task_of(spec, tenant="b")) != ""


def test_anti_affinity_keys_in_the_namespace_are_refused() -> None:
    """The scheduler spreads a training group's members with its own key
    (`heteroflow.training-group:<id>`): a tenant's key may not be one."""
    body = TASK | {"anti_affinity": ["web", "heteroflow.training-group:grp-1"]}
    err = refused(parse_create, body, tenant=True)
    assert err.code is Code.SERVER_OWNED_FIELD and err.fields == ["anti_affinity.1"]
