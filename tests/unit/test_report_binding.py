"""A report speaks only for the node whose subject it came on (services/scheduler/routes.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from libs.bus.subjects import node_of_subject, node_report_subject
from libs.domain.node.model import NodeInventory
from libs.domain.protocol import AgentReport, Fact, Heartbeat, NodeReport, Registration
from libs.domain.task.states import TaskStatus
from libs.domain.telemetry import TelemetryBatch
from services.event_timeline.service import from_its_node as timeline_from_its_node
from services.scheduler.routes import from_its_node

AT = datetime(2026, 1, 1, tzinfo=UTC)


def report(node: str) -> NodeReport:
    rep = AgentReport(
        node_id=node,
        task_id="t1",
        attempt=0,
        fact=Fact.EXITED,
        expected_status=TaskStatus.RUNNING,
        exit_code=0,
        at=AT,
    )
    return NodeReport(rep)


def registration(node: str) -> NodeReport:
    inv = NodeInventory(hostname="h", address="127.0.0.1", memory_mb=1, cpu_cores=1)
    return NodeReport(Registration(node_id=node, inventory=inv, at=AT))


@pytest.mark.parametrize(
    ("subject", "message", "ok"),
    [
        (node_report_subject("n1"), report("n1"), True),
        (node_report_subject("n1"), report("n2"), False),
        (node_report_subject("n1"), registration("n1"), True),
        (node_report_subject("n1"), registration("n2"), False),
        (node_report_subject("a.b"), report("a.b"), True),
        (node_report_subject("a.b"), report("a%2Eb"), False),
        ("hf.events.task.t1.x", report("n1"), False),
    ],
    ids=["own", "other", "own-reg", "other-reg", "escaped", "escape-trick", "not-a-node"],
)
def test_from_its_node(subject: str, message: NodeReport, ok: bool) -> None:
    assert from_its_node(subject, message) is ok


def test_node_of_subject() -> None:
    assert node_of_subject("hf.node.n1.report") == "n1"
    assert node_of_subject("hf.node.n1") is None
    assert node_of_subject("hf.other.n1.report") is None


def test_a_heartbeat_speaks_for_its_subjects_node_only() -> None:
    beat = Heartbeat(node_id="n2", seq=1, visible_gpus=[], at=AT)
    assert from_its_node("hf.node.n2.heartbeat", beat)
    assert not from_its_node("hf.node.n1.heartbeat", beat)


def test_telemetry_speaks_for_its_subjects_node_only() -> None:
    batch = TelemetryBatch(node_id="n2", samples=())
    assert timeline_from_its_node("hf.node.n2.telemetry", batch)
    assert not timeline_from_its_node("hf.node.n1.telemetry", batch)
