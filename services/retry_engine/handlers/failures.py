"""A task failed: decide retry or give-up (`decide.decide_retry`) and append the decision.

Exactly once: the decision commits with the consumer's receipt for the failure event
(libs/store/inbox.py), so a redelivered or republished failure changes nothing. A failure is
also acted on only while it is still the task's latest event: evidence of an older failure is
not evidence of the current one.
"""

from __future__ import annotations

import structlog
from prometheus_client import Counter

from libs.bus.typed import EventHandlers
from libs.domain.envelope import EventEnvelope
from libs.domain.errors import NotFound
from libs.domain.node.events import CardQuarantined
from libs.domain.node.model import Node, NodeStatus
from libs.domain.payload import Payload
from libs.domain.task.events import TaskRetryDecided, TaskStatusChanged
from libs.domain.task.failure import DeviceFault
from libs.domain.task.model import Task
from libs.domain.task.states import TaskStatus
from libs.store import inbox
from libs.store import nodes as node_rows
from libs.store.eventstore import EventStore
from libs.store.projections import NODES

from ..decide import (
    Evidence,
    NodeFacts,
    RetryConfig,
    cards_at_fault,
    decide_retry,
    device_fault,
)
from ..routes import CONSUMER

log = structlog.get_logger(__name__)

DECISIONS = Counter("heteroflow_retry_decisions_total", "Retry decisions", ["action", "cls"])
QUARANTINED = Counter(
    "heteroflow_cards_quarantined_total", "Cards quarantined after a device fault", ["code"]
)


def node_facts(node: Node) -> NodeFacts:
    vram = {g.id: g.vram_mb for g in node.inventory.gpus}
    return NodeFacts(
        online=node.status is NodeStatus.ONLINE,
        memory_mb=node.inventory.memory_mb,
        max_vram_mb=max(vram.values(), default=0),
        vram_by_gpu=vram,
    )


def evidence_of(env: EventEnvelope, ev: TaskStatusChanged) -> Evidence:
    """What the failure says about itself, for the classifier."""
    return Evidence(
        exit_code=ev.exit_code,
        oom_killed=bool(ev.oom_killed),
        error_kind=ev.error_kind or "",
        error=ev.error or "",
        output=ev.result or "",
        failed_at=env.occurred_at,
        device_log=ev.device_log or "",
        xids=ev.xids or (),
    )


def quarantine_events(node: Node | None, task: Task, fault: DeviceFault) -> list[Payload]:
    """`card_quarantined` for each card at fault not quarantined yet (a redelivery adds none)."""
    if node is None:
        return []
    held = {q.gpu_id for q in node.quarantined_gpus}
    known = {g.id for g in node.inventory.gpus}
    return [
        CardQuarantined(
            node_id=node.id, gpu_id=card, code=fault.code, evidence=fault.evidence, task_id=task.id
        )
        for card in cards_at_fault(task, fault)
        if card in known and card not in held
    ]


class RetryEngine:
    def __init__(self, store: EventStore, cfg: RetryConfig) -> None:
        self.store = store
        self.cfg = cfg
        self.handlers = EventHandlers.of(self.on_status_changed, owner=CONSUMER)

    async def handle(self, envelope: EventEnvelope) -> None:
        """One envelope off the bus: parsed, then handled if a handler takes its type."""
        await self.handlers(envelope)

    async def on_status_changed(self, env: EventEnvelope, ev: TaskStatusChanged) -> None:
        if ev.to_status is not TaskStatus.FAILED:
            return
        evidence = evidence_of(env, ev)
        version = env.version
        try:
            seen = await self.store.get_task(ev.task_id, include_deleted=True)
        except NotFound:
            return
        if seen.version != version:
            return  # a redelivery of a failure already handled
        # The failed node and the best other online node answer every question the
        # decision asks of the fleet; the rest of the fleet is not read.
        nearby = await node_rows.with_best_alternative(self.store, seen.node_id or "")
        nodes = {n.id: node_facts(n) for n in nearby}
        await self._quarantine(seen, evidence)

        def decide(task: Task) -> list[Payload]:
            if task.version != version:
                return []  # not the latest failure any more: already handled
            return decide_retry(task, evidence, self.cfg, nodes)

        try:
            task = await self.store.execute(
                ev.task_id,
                decide,
                include_deleted=True,
                metadata={"actor": "retry_engine"},
                receipt=inbox.Receipt(CONSUMER, env.event_id),
            )
        except NotFound:
            return
        if task.version != version:
            decision = await self._last_decision(task.id)
            if decision:
                DECISIONS.labels(decision.action, decision.failure_class).inc()
                log.info(
                    "retry_decided", task_id=task.id, action=decision.action, reason=decision.reason
                )

    async def _quarantine(self, task: Task, evidence: Evidence) -> None:
        """Take the failed cards out of placement before the task is requeued, so the
        scheduler's next round cannot put it back on them."""
        fault = device_fault(task, evidence)
        if not task.node_id or not cards_at_fault(task, fault):
            return
        made: list[Payload] = []

        def decide(node: Node | None) -> list[Payload]:
            made[:] = quarantine_events(node, task, fault)
            return list(made)

        await self.store.execute_aggregate(NODES, task.node_id, decide)
        for ev in made:
            QUARANTINED.labels(fault.code).inc()
            log.warning(
                "card_quarantined",
                node_id=task.node_id,
                gpu_id=getattr(ev, "gpu_id", ""),
                code=fault.code,
                task_id=task.id,
                evidence=fault.evidence,
            )

    async def _last_decision(self, task_id: str) -> TaskRetryDecided | None:
        last = await self.store.last_of_type(task_id, TaskRetryDecided.type)
        return TaskRetryDecided.model_validate(last.payload) if last else None
