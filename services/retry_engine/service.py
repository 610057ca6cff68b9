"""The retry-engine service: consumes failures, writes its decision, requeues with CAS.

Exactly once: the decision commits with the consumer's receipt for the failure event
(libs/store/inbox.py), so a redelivered or republished failure changes nothing. A failure is
also acted on only while it is still the task's latest event: evidence of an older failure is
not evidence of the current one.
"""

from __future__ import annotations

import asyncio

import structlog
from prometheus_client import Counter
from pydantic import Field

from libs.bus.broker import Handle, Routes, serve
from libs.bus.subjects import EVENTS_PREFIX, EVENTS_STREAM
from libs.config import CommonSettings
from libs.domain.envelope import EventEnvelope
from libs.domain.errors import NotFound
from libs.domain.events import Payload, TaskRetryDecided
from libs.domain.node import Node, NodeStatus
from libs.domain.task import Task
from libs.periodic import periodic
from libs.service import ServiceContext
from libs.store import inbox
from libs.store import nodes as node_rows
from libs.store.eventstore import EventStore

from .decide import Evidence, NodeFacts, RetryConfig, decide_retry

log = structlog.get_logger(__name__)

CONSUMER = "retry-engine"
INBOX_PURGE_INTERVAL_S = 3600.0
DECISIONS = Counter("heteroflow_retry_decisions_total", "Retry decisions", ["action", "cls"])


class RetrySettings(CommonSettings):
    retry_delay: float = Field(default=30.0, ge=0, description="seconds before retry 1")
    retry_backoff_multiplier: float = Field(default=2.0, ge=1)
    retry_oom_memory_limit: int = Field(default=16384, gt=0, description="MB cap for OOM doubling")

    def config(self) -> RetryConfig:
        return RetryConfig(
            self.retry_delay, self.retry_backoff_multiplier, self.retry_oom_memory_limit
        )


def node_facts(node: Node) -> NodeFacts:
    vram = {g.id: g.vram_mb for g in node.inventory.gpus}
    return NodeFacts(
        online=node.status is NodeStatus.ONLINE,
        memory_mb=node.inventory.memory_mb,
        max_vram_mb=max(vram.values(), default=0),
        vram_by_gpu=vram,
    )


class RetryEngine:
    def __init__(self, store: EventStore, cfg: RetryConfig) -> None:
        self.store = store
        self.cfg = cfg

    async def handle(self, envelope: EventEnvelope) -> None:
        payload = envelope.payload
        if envelope.type != "task_status_changed" or payload.get("to_status") != "failed":
            return
        evidence = Evidence(
            exit_code=payload.get("exit_code"),
            oom_killed=bool(payload.get("oom_killed")),
            error_kind=payload.get("error_kind") or "",
            error=payload.get("error") or "",
            output=payload.get("result") or "",
            failed_at=envelope.occurred_at,
        )
        version = envelope.version
        try:
            seen = await self.store.get_task(payload["task_id"], include_deleted=True)
        except NotFound:
            return
        if seen.version != version:
            return  # a redelivery of a failure already handled
        # The failed node and the best other online node answer every question the
        # decision asks of the fleet; the rest of the fleet is not read.
        nearby = await node_rows.with_best_alternative(self.store, seen.node_id or "")
        nodes = {n.id: node_facts(n) for n in nearby}

        def decide(task: Task) -> list[Payload]:
            if task.version != version:
                return []  # not the latest failure any more: already handled
            return decide_retry(task, evidence, self.cfg, nodes)

        try:
            task = await self.store.execute(
                payload["task_id"],
                decide,
                include_deleted=True,
                metadata={"actor": "retry_engine"},
                receipt=inbox.Receipt(CONSUMER, envelope.event_id),
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

    async def _last_decision(self, task_id: str) -> TaskRetryDecided | None:
        last = await self.store.last_of_type(task_id, TaskRetryDecided.type)
        return TaskRetryDecided.model_validate(last.payload) if last else None


async def run(ctx: ServiceContext, stop: asyncio.Event, settings: RetrySettings) -> None:
    engine = RetryEngine(ctx.store, settings.config())

    async def purge() -> None:
        await inbox.purge(ctx.store, CONSUMER)

    await asyncio.gather(
        serve(ctx.nc, [routes(engine.handle)], stop),
        periodic("inbox_purge", purge, stop, INBOX_PURGE_INTERVAL_S),
    )


def routes(failures: Handle[EventEnvelope]) -> Routes:
    """The retry engine's subscriber (handlers as arguments: see heteroflow/asyncapi.py)."""
    r = Routes("retry-engine")
    r.durable(
        EventEnvelope,
        failures,
        stream=EVENTS_STREAM,
        durable=CONSUMER,
        subject=f"{EVENTS_PREFIX}.task.{{task_id}}.task_status_changed",
        description="Decides retry or give-up for each task that failed.",
    )
    return r
