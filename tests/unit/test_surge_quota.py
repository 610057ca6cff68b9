"""Surge quota: a rolling update's new replica may pass the tenant's GPU quota by its
allowance, no further; other work gets no allowance, whatever its labels say."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from libs.domain.errors import Code, DomainError
from libs.domain.task.model import Platform, Task, TaskId, TaskSpec, TenantId, parse_create
from services.scheduler.placement.feasibility import (
    Quota,
    check_quota_floor,
)
from services.scheduler.placement.model import PendingTask

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEGACY_SURGE_LABEL = "heteroflow.rollout_surge_cards"


def pending(surge: float = 0.0, labels: dict[str, str] | None = None) -> PendingTask:
    spec = TaskSpec(
        name="r",
        image="x",
        gpu_required=1,
        labels=labels or {},
        platform=Platform(surge_cards=surge),
    )
    task = Task(id=TaskId("t1"), tenant_id=TenantId("a"), spec=spec, created_at=T0, updated_at=T0)
    return PendingTask.from_task(task)


@pytest.mark.parametrize(
    ("surge", "labels", "ok"),
    [
        (0.0, {}, False),
        (1.0, {}, True),
        (0.0, {LEGACY_SURGE_LABEL: "4"}, False),
    ],
    ids=["plain-task-at-quota", "surge-replica", "a-label-is-no-allowance"],
)
def test_a_tenant_at_full_quota(surge: float, labels: dict[str, str], ok: bool) -> None:
    task = pending(surge, labels)
    assert task.surge_cards == surge
    verdict = check_quota_floor(task, Quota("a", 2, 2, task.surge_cards))
    assert verdict.ok is ok


def test_beyond_the_allowance_is_refused_and_says_so() -> None:
    task = pending(1.0)
    verdict = check_quota_floor(task, Quota("a", 2, 2.5, task.surge_cards))
    assert not verdict.ok and "surge allowance of 1" in verdict.message


def test_a_tenant_cannot_ask_for_a_surge_allowance() -> None:
    """The label the scheduler once read is refused at entry (40002 naming it), and the
    server-owned field cannot be sent either."""
    body = {"name": "r", "image": "x", "gpu_required": 4, "labels": {LEGACY_SURGE_LABEL: "4"}}
    with pytest.raises(DomainError) as exc:
        parse_create(body, tenant=True)
    assert exc.value.code is Code.SERVER_OWNED_FIELD
    assert exc.value.fields == [f"labels.{LEGACY_SURGE_LABEL}"]
    assert LEGACY_SURGE_LABEL in exc.value.message
    owned = {"name": "r", "image": "x", "platform": {"surge_cards": 4}}
    with pytest.raises(DomainError) as exc:
        parse_create(owned, tenant=True)
    assert exc.value.code is Code.SERVER_OWNED_FIELD and exc.value.fields == ["platform"]
