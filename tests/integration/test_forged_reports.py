"""A report published on one node's subject that speaks for another node is refused by the
scheduler: an agent, whose NATS user may publish only on its own report subject, cannot
complete another node's task by naming that node in the payload."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import nats
import pytest

from libs.bus.subjects import node_report_subject
from libs.domain.protocol import AgentReport, Fact
from libs.domain.states import TaskStatus

from . import web
from .cluster import Cluster, run_async

pytestmark = pytest.mark.integration

REFUSED = re.compile(
    r'heteroflow_consumer_messages_total\{consumer="scheduler-reports",result="refused"\} (\S+)'
)


def refused(cluster: Cluster) -> float:
    found = REFUSED.search(web.get(f"{cluster.url}/metrics", timeout=10).text)
    return float(found.group(1)) if found else 0.0


def test_a_report_naming_another_node_is_refused(cluster: Cluster) -> None:
    cluster.start_agent("n1")
    cluster.start_agent("n2")
    t = cluster.create(command="sleep 60", requested_node_id="n2")
    cluster.wait_status(t["id"], "running")
    forged = AgentReport(
        node_id="n2",
        task_id=t["id"],
        attempt=0,
        fact=Fact.EXITED,
        expected_status=TaskStatus.RUNNING,
        exit_code=0,
        output_tail=["forged"],
        at=datetime.now(UTC),
    )

    async def publish() -> None:
        nc = await nats.connect(cluster.nats.url)
        try:
            # On n1's subject, the only one n1's agent may publish reports on.
            await nc.jetstream().publish(
                node_report_subject("n1"), forged.model_dump_json().encode()
            )
        finally:
            await nc.close()

    run_async(publish())
    cluster.wait(lambda: refused(cluster) >= 1, "the forged report refused")
    assert cluster.task(t["id"])["status"] == "running"
    assert "completed" not in cluster.statuses(t["id"])
