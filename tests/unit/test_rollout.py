"""Rolling update: request validation and the durable generation/draining fold."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from libs.domain.errors import Code, DomainError
from libs.domain.group.model import GroupSpec, parse_group
from libs.domain.payload import parse_payload
from libs.domain.reasons import ReasonCode
from libs.domain.rollout.decide import decide_drain, parse_rollout
from libs.domain.task.events import TaskCreated, TaskStatusChanged
from libs.domain.task.evolve import evolve_task
from libs.domain.task.model import TaskId, TaskSpec, TenantId
from libs.domain.task.states import TaskStatus

AT = datetime(2026, 1, 1, tzinfo=UTC)


def group(**kw: Any) -> GroupSpec:
    return parse_group({"name": "g", "image": "x", "task_count": 3} | kw, tenant=True)


def refused(raw: Any, g: GroupSpec | None = None) -> DomainError:
    with pytest.raises(DomainError) as err:
        parse_rollout(raw, g or group())
    return err.value


def test_defaults_and_env_forms() -> None:
    req = parse_rollout({"image": "v2", "env": ["A=1"]}, group())
    assert (req.max_surge, req.max_unavailable, req.partition) == (1, 0, None)
    assert req.health_timeout_s == 300 and req.env == {"A": "1"}


def test_unknown_fields_are_named() -> None:
    err = refused({"image": "v2", "imagee": "v3", "surge": 2})
    assert err.code is Code.UNKNOWN_FIELD and err.fields == ["imagee", "surge"]


def test_bad_values_are_named() -> None:
    err = refused({"image": "v2", "max_surge": -1, "partition": -1})
    assert err.code is Code.INVALID_VALUE and err.fields == ["max_surge", "partition"]
    # Kubernetes semantics: max_surge 0 is fine with max_unavailable > 0, not both 0.
    err = refused({"image": "v2", "max_surge": 0, "max_unavailable": 0})
    assert err.code is Code.INVALID_VALUE and err.fields == ["max_surge", "max_unavailable"]
    assert "both 0" in err.message
    assert refused({"max_surge": 2}).fields == ["image"]  # nothing to change
    assert refused([1]).code is Code.INVALID_VALUE


def test_static_world_offers_recreate() -> None:
    training = group(task_type="training", gpu_required=1)
    err = refused({"image": "v2"}, training)
    assert err.fields == ["strategy"] and '"strategy": "recreate"' in str(err)
    assert parse_rollout({"image": "v2", "strategy": "recreate"}, training).strategy == "recreate"


def test_generation_and_draining_fold_from_events() -> None:
    spec = TaskSpec(name="r", image="x")
    created = TaskCreated(
        task_id=TaskId("t"), tenant_id=TenantId("a"), spec=spec, group_id="g", rank=0, generation=2
    )
    task = evolve_task(None, created, AT, 1)
    assert (task.generation, task.draining) == (2, False)
    (mark,) = decide_drain(task)
    # Stored and loaded back as any event is (the projection stores the folded document).
    loaded = parse_payload(mark.type, mark.model_dump(mode="json"))
    task = evolve_task(task, loaded, AT, 2)
    assert task.draining and task.generation == 2
    assert decide_drain(task) == []  # once is enough
    ended = TaskStatusChanged(
        task_id=task.id,
        from_status=TaskStatus.PENDING,
        to_status=TaskStatus.CANCELLED,
        actor="rollout",
        reason_code=ReasonCode.ROLLOUT_DRAIN,
    )
    assert (
        decide_drain(evolve_task(task.model_copy(update={"draining": False}), ended, AT, 3)) == []
    )
