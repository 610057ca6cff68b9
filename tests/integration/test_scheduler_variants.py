"""Variants against a real PostgreSQL (docs/scheduling.md#variants): the placed variant is
stored on the task row, and a replica group's next member is held to the variant its placed
member runs (`view.load_group_variants`), while a group none of whose members holds a
placement chooses again."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from libs.domain.reasons import ReasonCode
from libs.domain.task.decide import decide_transition
from libs.domain.task.model import TenantId, parse_create
from libs.domain.task.states import Actor, TaskStatus
from libs.store import tasks as task_rows
from libs.store.eventstore import EventStore
from services.scheduler import view
from services.scheduler.placement.model import ClusterSnapshot, Gpu, Node
from services.scheduler.placement.planner import plan

pytestmark = pytest.mark.integration

T = TenantId("acme")
VARIANTS = [
    {"gpu_type": "nvidia/A100", "gpu_required": 1, "wait_s": 0},
    {"gpu_type": "huawei/Ascend910B", "gpu_required": 1},
]


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[EventStore]:
    st = await EventStore.open(database_url, max_size=4)
    yield st
    await st.close()


async def test_replicas_follow_the_variant_their_group_runs(store: EventStore) -> None:
    group = "group-" + uuid.uuid4().hex[:10]
    spec = parse_create({"name": "r", "image": "busybox", "variants": VARIANTS}, tenant=True)
    first = await store.create_task(T, spec, group_id=group, rank=0)
    second = await store.create_task(T, spec, group_id=group, rank=1)
    assert await view.load_group_variants(store, [second]) == {}
    await store.execute(
        first.id,
        lambda t: decide_transition(
            t,
            TaskStatus.SCHEDULED,
            actor=Actor.SCHEDULER,
            expected_status=TaskStatus.PENDING,
            reason_code=ReasonCode.PLACED,
            node_id="ascend",
            gpu_ids=("ascend-gpu0",),
            variant=1,
        ),
    )
    (stored,) = await task_rows.by_ids(store, [first.id])
    assert stored.variant == 1
    pins = await view.load_group_variants(store, [second])
    assert pins == {group: 1}
    pending = view.pending_of(second, {}, pins)
    assert pending.variant_pin == 1
    # A free A100 is there, but the group runs the Ascend variant: so does this member.
    now = datetime.now(UTC) + timedelta(seconds=5)
    nodes = (
        Node("a100", True, 65536, 16, (Gpu("a100-gpu0", 0, "nvidia", "A100-80GB", 81920),)),
        Node("ascend2", True, 65536, 16, (Gpu("asc-gpu0", 0, "huawei", "Ascend910B", 65536),)),
    )
    (placed,) = plan(ClusterSnapshot(now=now, nodes=nodes), [pending]).placements
    assert (placed.node_id, placed.variant) == ("ascend2", 1)
    # The placed member ends: nothing holds a variant, the group chooses again.
    await store.execute(
        first.id,
        lambda t: decide_transition(
            t,
            TaskStatus.CANCELLED,
            actor=Actor.OPERATOR,
            expected_status=TaskStatus.SCHEDULED,
            reason_code=ReasonCode.USER_STOP,
        ),
    )
    assert await view.load_group_variants(store, [second]) == {}
