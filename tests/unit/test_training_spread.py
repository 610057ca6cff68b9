"""Training groups run one container per node without an anti-affinity key (seed 000)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from libs.domain.task.model import Task, TaskId, TaskSpec, TaskType, TenantId
from libs.domain.task.states import TaskStatus
from services.scheduler.placement.model import (
    Allocation,
    ClusterSnapshot,
    Gpu,
    Node,
    PendingTask,
)
from services.scheduler.placement.planner import plan
from services.scheduler.placement.reasons import Reason

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def node(node_id: str, gpus: int = 8) -> Node:
    cards = tuple(Gpu(f"{node_id}-gpu{i}", i, "nvidia", "A100", 81920) for i in range(gpus))
    return Node(node_id, True, 512 * 1024, 128, cards)


def member(
    rank: int,
    task_type: TaskType = TaskType.TRAINING,
    *,
    group: str = "grp-1",
    status: TaskStatus = TaskStatus.PENDING,
    node_id: str | None = None,
) -> Task:
    spec = TaskSpec(name=f"m-{rank}", image="img", gpu_required=1, task_type=task_type)
    return Task(
        id=TaskId(f"{group}-t{rank}"),
        tenant_id=TenantId("acme"),
        spec=spec,
        status=status,
        node_id=node_id,
        gpu_ids=(f"{node_id}-gpu0",) if node_id else (),
        group_id=group,
        rank=rank,
        created_at=NOW,
        updated_at=NOW,
    )


def gang(tasks: list[Task]) -> list[PendingTask]:
    return [PendingTask.from_task(t, gang_id=t.group_id, gang_size=len(tasks)) for t in tasks]


def snapshot(*nodes: Node, holding: tuple[Task, ...] = ()) -> ClusterSnapshot:
    gpus = {g.id: g for n in nodes for g in n.gpus}
    allocs = tuple(Allocation.from_task(t, gpus) for t in holding)
    return ClusterSnapshot(NOW, nodes, allocs, {})


def test_training_gang_lands_on_distinct_nodes() -> None:
    # Bin-packing alone would put both one-card members on the same (fuller) node.
    result = plan(snapshot(node("n1"), node("n2")), gang([member(0), member(1)]))
    assert sorted(p.node_id for p in result.placements) == ["n1", "n2"]


def test_training_gang_waits_rather_than_doubling_up() -> None:
    result = plan(snapshot(node("n1")), gang([member(0), member(1)]))
    assert result.placements == ()
    reasons = {u.reason for u in result.unplaced}
    assert Reason.ANTI_AFFINITY in reasons


def test_a_running_member_keeps_its_node_to_itself() -> None:
    running = member(0, status=TaskStatus.RUNNING, node_id="n1")
    pending = [PendingTask.from_task(member(1))]
    result = plan(snapshot(node("n1"), node("n2"), holding=(running,)), pending)
    assert [p.node_id for p in result.placements] == ["n2"]


@pytest.mark.parametrize("task_type", [TaskType.INFERENCE, TaskType.BATCH, TaskType.UNSET])
def test_other_groups_may_share_a_node(task_type: TaskType) -> None:
    tasks = [member(0, task_type), member(1, task_type)]
    result = plan(snapshot(node("n1")), gang(tasks))
    assert [p.node_id for p in result.placements] == ["n1", "n1"]


def test_another_training_group_is_not_kept_out() -> None:
    running = member(0, status=TaskStatus.RUNNING, node_id="n1", group="grp-other")
    result = plan(snapshot(node("n1"), holding=(running,)), [PendingTask.from_task(member(0))])
    assert [p.node_id for p in result.placements] == ["n1"]
