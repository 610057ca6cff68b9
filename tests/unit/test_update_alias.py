"""A task update checks `gpu_required` and its V2 alias `gpu_count` as a create does: a bad
value under either name is refused naming it, never dropped because the other name was sent."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from libs.domain.errors import Code, DomainError
from libs.domain.task.model import Task, TaskId, TenantId, parse_create, parse_update


def _task() -> Task:
    now = datetime.now(UTC)
    spec = parse_create({"name": "x", "image": "busybox", "gpu_required": 1}, tenant=True)
    return Task(id=TaskId("t"), tenant_id=TenantId("a"), spec=spec, created_at=now, updated_at=now)


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"gpu_count": 0, "gpu_required": {}}, ["gpu_required"]),
        ({"gpu_count": "2"}, ["gpu_count"]),
        ({"gpu_count": 2, "gpu_required": 3}, ["gpu_count", "gpu_required"]),
    ],
)
def test_a_bad_card_count_under_either_name_is_refused(
    body: dict[str, Any], fields: list[str]
) -> None:
    with pytest.raises(DomainError) as err:
        parse_update(_task(), body, tenant=True)
    assert err.value.code is Code.INVALID_VALUE and err.value.fields == fields


@pytest.mark.parametrize(
    "body", [{"gpu_count": 2}, {"gpu_required": 2}, {"gpu_count": 2, "gpu_required": 2}]
)
def test_either_name_updates_the_card_count(body: dict[str, Any]) -> None:
    spec, changes = parse_update(_task(), body, tenant=True)
    assert spec.gpu_required == 2 and changes == {"gpu_required": 2}
