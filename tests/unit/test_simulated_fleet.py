"""The simulated fleet's pure parts: the inventories it declares and the reports it sends."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agent.simulated_fleet import DEFAULT_KINDS, NodeKind, finished, fleet_inventories, replies
from libs.domain.protocol import CommandKind, Fact, NodeCommand, decide_report
from libs.domain.task.model import Task, TaskId, TaskSpec, TenantId
from libs.domain.task.states import TaskStatus

AT = datetime(2026, 1, 1, tzinfo=UTC)


def test_inventories_cycle_the_kinds_with_unique_card_ids() -> None:
    nodes = fleet_inventories(12)
    assert [n for n, _ in nodes][:3] == ["sim-00000", "sim-00001", "sim-00002"]
    models = [inv.gpus[0].model for _, inv in nodes]
    assert models[: len(DEFAULT_KINDS)] == [k.model for k in DEFAULT_KINDS]
    assert models[len(DEFAULT_KINDS)] == DEFAULT_KINDS[0].model
    cards = [g.id for _, inv in nodes for g in inv.gpus]
    assert len(cards) == len(set(cards))
    assert sum(len(inv.gpus) for _, inv in nodes[:5]) == sum(k.count for k in DEFAULT_KINDS)


def test_inventories_take_custom_kinds_and_a_prefix() -> None:
    kind = NodeKind("amd", "MI300X", 196_608, 2)
    ((node_id, inv),) = fleet_inventories(1, (kind,), prefix="edge", cpu_cores=8)
    assert node_id == "edge-00000"
    assert [(g.vendor, g.model, g.index) for g in inv.gpus] == [
        ("amd", "MI300X", 0),
        ("amd", "MI300X", 1),
    ]
    assert inv.cpu_cores == 8 and inv.runtime == "simulated"


def cmd(kind: CommandKind, status: TaskStatus) -> NodeCommand:
    return NodeCommand(kind=kind, node_id="sim-1", task_id="t1", attempt=2, status=status)


REPLY_CASES = [
    (
        cmd(CommandKind.START, TaskStatus.SCHEDULED),
        [(Fact.STARTING, TaskStatus.SCHEDULED), (Fact.RUNNING, TaskStatus.STARTING)],
        "start",
    ),
    (cmd(CommandKind.STOP, TaskStatus.STOPPING), [(Fact.EXITED, TaskStatus.STOPPING)], "stop"),
    (
        cmd(CommandKind.STOP, TaskStatus.PREEMPTING),
        [(Fact.EXITED, TaskStatus.PREEMPTING)],
        "preempt",
    ),
    (cmd(CommandKind.PAUSE, TaskStatus.SLEEPING), [(Fact.PAUSED, TaskStatus.SLEEPING)], "pause"),
    (cmd(CommandKind.RESUME, TaskStatus.WAKING), [(Fact.RESUMED, TaskStatus.WAKING)], "resume"),
]


@pytest.mark.parametrize(
    ("command", "expected"), [c[:2] for c in REPLY_CASES], ids=[c[2] for c in REPLY_CASES]
)
def test_replies(command: NodeCommand, expected: list[tuple[Fact, TaskStatus]]) -> None:
    reports = replies(command, AT)
    assert [(r.fact, r.expected_status) for r in reports] == expected
    assert all((r.node_id, r.task_id, r.attempt, r.at) == ("sim-1", "t1", 2, AT) for r in reports)


def test_a_finished_task_reports_exit_zero_and_completes() -> None:
    report = finished("sim-1", "t1", 2, AT)
    assert (report.fact, report.expected_status, report.exit_code) == (
        Fact.EXITED,
        TaskStatus.RUNNING,
        0,
    )
    spec = TaskSpec(name="x", image="sim:latest", gpu_required=1)
    running = Task(
        id=TaskId("t1"),
        tenant_id=TenantId("t"),
        spec=spec,
        status=TaskStatus.RUNNING,
        node_id="sim-1",
        retry_count=2,
        created_at=AT,
        updated_at=AT,
    )
    (event,) = decide_report(running, report)
    assert event.to_status is TaskStatus.COMPLETED
