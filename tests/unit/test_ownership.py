"""Foreign references: a task that claims a group (or a generation) it was not created for
is no member, a card is lent within its tenant only; each refusal is counted by kind."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import REGISTRY

from libs.domain.errors import Code, DomainError
from libs.domain.group.model import Group, parse_group
from libs.domain.task.lending import decide_lend
from libs.domain.task.model import Task, TaskId, TaskSpec, TenantId
from libs.domain.task.states import TaskStatus
from libs.ownership import own_members

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def counted(kind: str) -> float:
    value = REGISTRY.get_sample_value("heteroflow_foreign_references_total", {"kind": kind})
    return value or 0.0


def member(task_id: str, **kw: Any) -> Task:
    base: dict[str, Any] = {
        "id": TaskId(task_id),
        "tenant_id": TenantId("acme"),
        "spec": TaskSpec(name="m", image="x"),
        "group_id": "grp-1",
        "rank": 0,
        "created_at": T0,
        "updated_at": T0,
    }
    return Task(**(base | kw))


def test_only_the_groups_own_tasks_are_its_members() -> None:
    spec = parse_group({"name": "g", "image": "x", "task_count": 2}, tenant=True)
    group = Group(id="grp-1", tenant_id=TenantId("acme"), spec=spec, created_at=T0, updated_at=T0)
    ours = [member("a"), member("b", rank=1)]
    foreign = [
        member("c", tenant_id=TenantId("globex")),  # another tenant's task naming the group
        member("d", group_id="grp-2"),  # another group's
        member("e", generation=3),  # a generation no rollout of the group has reached
    ]
    before = counted("group_member")
    assert own_members(group, [*ours, *foreign]) == ours
    assert counted("group_member") == before + 3
    assert own_members(group, ours) == ours and counted("group_member") == before + 3


def test_a_card_is_lent_within_its_tenant_only() -> None:
    lender = Task(
        id=TaskId("lender"),
        tenant_id=TenantId("acme"),
        spec=TaskSpec(name="t", gpu_required=1),
        status=TaskStatus.SLEEPING,
        sleep_released=True,
        node_id="n1",
        gpu_ids=("n1-gpu0",),
        created_at=T0,
        updated_at=T0,
    )
    with pytest.raises(DomainError) as exc:
        decide_lend(lender, "b", "n1", ("n1-gpu0",), borrower_tenant_id="globex")
    assert exc.value.code is Code.FORBIDDEN
    assert decide_lend(lender, "b", "n1", ("n1-gpu0",), borrower_tenant_id="acme")
