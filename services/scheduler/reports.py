"""Apply what agents report: registrations and task facts, through the store's CAS.

A stale report (its expected status is no longer the task's) is refused like any CAS miss
and logged; the same fact is then applied from the current status, so an exit after a stop
request records `stopped`, never `completed`. A container running for a task that is no
longer this node's (an agent back after its tasks migrated) is told to stop.
"""

from __future__ import annotations

import structlog
from nats.js import JetStreamContext

from libs.domain.errors import Conflict, NotFound
from libs.domain.node import Node, NodeRegistered
from libs.domain.protocol import (
    AgentReport,
    CommandKind,
    Fact,
    NodeCommand,
    NodeReport,
    Registration,
    decide_reconcile,
    decide_report,
)
from libs.domain.states import TaskStatus
from libs.store.eventstore import EventStore
from libs.store.projections import NODES

from .dispatch import send

log = structlog.get_logger(__name__)


class ReportHandler:
    def __init__(self, store: EventStore, js: JetStreamContext) -> None:
        self.store = store
        self.js = js

    async def handle(self, message: NodeReport) -> None:
        if isinstance(message.root, Registration):
            await self.register(message.root)
        else:
            await self.report(message.root)

    async def register(self, reg: Registration) -> None:
        def decide(node: Node | None) -> list[NodeRegistered]:
            if (
                node is not None
                and node.status.value == "online"
                and (node.inventory == reg.inventory)
            ):
                return []  # a repeated registration changes nothing
            return [NodeRegistered(node_id=reg.node_id, inventory=reg.inventory)]

        await self.store.execute_aggregate(NODES, reg.node_id, decide)
        log.info("node_registered", node_id=reg.node_id, gpus=len(reg.inventory.gpus))

    async def report(self, rep: AgentReport) -> None:
        meta = {"node_id": rep.node_id, "fact": rep.fact.value}
        try:
            task = await self.store.execute(
                rep.task_id,
                lambda t: decide_report(t, rep),
                metadata=meta,
                include_deleted=True,
            )
        except NotFound:
            log.warning("report_for_unknown_task", task_id=rep.task_id, node_id=rep.node_id)
            return
        except Conflict as exc:
            log.info("stale_report_refused", task_id=rep.task_id, error=exc.message)
            task = await self.store.execute(
                rep.task_id,
                lambda t: decide_reconcile(t, rep),
                metadata=meta,
                include_deleted=True,
            )
        orphan = task.node_id != rep.node_id or task.retry_count != rep.attempt
        if orphan and rep.fact in (Fact.STARTING, Fact.RUNNING, Fact.RESUMED, Fact.PAUSED):
            log.warning("orphan_container_stopped", task_id=rep.task_id, node_id=rep.node_id)
            await send(
                self.js,
                NodeCommand(
                    kind=CommandKind.STOP,
                    node_id=rep.node_id,
                    task_id=rep.task_id,
                    attempt=rep.attempt,
                    status=TaskStatus.STOPPING,
                    grace_s=5.0,
                ),
            )
