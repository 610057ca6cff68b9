"""Surge quota: a rolling update's new replica may pass the tenant's GPU quota by its
allowance, no further; other work gets no allowance."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from libs.domain.rollout_plan import SURGE_LABEL
from libs.domain.task import Task, TaskId, TaskSpec, TenantId
from services.scheduler.feasibility import Quota, check_quota_floor
from services.scheduler.model import PendingTask

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def pending(labels: dict[str, str]) -> PendingTask:
    spec = TaskSpec(name="r", image="x", gpu_required=1, labels=labels)
    task = Task(id=TaskId("t1"), tenant_id=TenantId("a"), spec=spec, created_at=T0, updated_at=T0)
    return PendingTask.from_task(task)


@pytest.mark.parametrize(
    ("labels", "surge", "ok"),
    [
        ({}, 0.0, False),
        ({SURGE_LABEL: "1"}, 1.0, True),
        ({SURGE_LABEL: "garbled"}, 0.0, False),
        ({SURGE_LABEL: "-3"}, 0.0, False),
    ],
    ids=["plain-task-at-quota", "surge-replica", "garbled-label", "negative-label"],
)
def test_a_tenant_at_full_quota(labels: dict[str, str], surge: float, ok: bool) -> None:
    task = pending(labels)
    assert task.surge_cards == surge
    verdict = check_quota_floor(task, Quota("a", 2, 2, task.surge_cards))
    assert verdict.ok is ok


def test_beyond_the_allowance_is_refused_and_says_so() -> None:
    task = pending({SURGE_LABEL: "1"})
    verdict = check_quota_floor(task, Quota("a", 2, 2.5, task.surge_cards))
    assert not verdict.ok and "surge allowance of 1" in verdict.message
