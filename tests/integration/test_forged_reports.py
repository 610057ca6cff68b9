"""A report or heartbeat published on one node's subject that speaks for another node is
refused by the scheduler: an agent, whose NATS user may publish only on its own subjects,
cannot complete another node's task or keep a dead node alive by naming it in the payload."""

from __future__ import annotations

import asyncio
import re
import threading
from datetime import UTC, datetime

import nats
import pytest

from libs.bus.subjects import node_heartbeat_subject, node_report_subject
from libs.domain.protocol import AgentReport, Fact, Heartbeat
from libs.domain.task.states import TaskStatus

from . import web
from .cluster import Cluster, run_async

pytestmark = pytest.mark.integration


def refused(cluster: Cluster, consumer: str = "scheduler-reports") -> float:
    metric = re.compile(
        rf'heteroflow_consumer_messages_total\{{consumer="{consumer}",result="refused"\}} (\S+)'
    )
    found = metric.search(web.get(f"{cluster.url}/metrics", timeout=10).text)
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


def test_heartbeats_naming_another_node_do_not_keep_it_alive(cluster: Cluster) -> None:
    cluster.start_agent("n1")
    cluster.start_agent("n2")
    cluster.kill_agent("n2")
    stop = threading.Event()

    async def forge() -> None:
        nc = await nats.connect(cluster.nats.url)
        try:
            seq = 0
            while not stop.is_set():  # n2's beats, on n1's subject
                seq += 1
                beat = Heartbeat(node_id="n2", seq=seq, visible_gpus=[], at=datetime.now(UTC))
                await nc.publish(node_heartbeat_subject("n1"), beat.model_dump_json().encode())
                await asyncio.sleep(0.2)
        finally:
            await nc.close()

    forger = threading.Thread(target=run_async, args=(forge(),), daemon=True)
    forger.start()
    try:
        status = {n["id"]: n["status"] for n in cluster.nodes()}
        assert status["n2"] == "online"
        cluster.wait(
            lambda: any(n["id"] == "n2" and n["status"] != "online" for n in cluster.nodes()),
            "n2 declared offline despite the forged beats",
        )
        assert refused(cluster, "scheduler:core") >= 1
    finally:
        stop.set()
        forger.join(10)
