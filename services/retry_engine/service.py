"""The retry-engine service: consumes failures, writes its decision, requeues with CAS.

Idempotent under redelivery: a failure event is acted on only while it is still the task's
latest event (its stream version equals the task's), so a redelivered or stale failure
changes nothing.
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
from libs.service import ServiceContext
from libs.store.eventstore import EventStore

from .decide import Evidence, NodeFacts, RetryConfig, decide_retry

log = structlog.get_logger(__name__)

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
        rows = await self.store.fetch("SELECT doc FROM nodes")
        nodes = {n.id: node_facts(n) for n in (Node.model_validate(r["doc"]) for r in rows)}
        version = envelope.version

        def decide(task: Task) -> list[Payload]:
            if task.version != version:
                return []  # not the latest failure any more: already handled
            return decide_retry(task, evidence, self.cfg, nodes)

        try:
            task = await self.store.execute(
                payload["task_id"], decide, include_deleted=True, metadata={"actor": "retry_engine"}
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
        rows = await self.store.fetch(
            "SELECT payload FROM events WHERE stream_id = %s AND type = 'task_retry_decided'"
            " ORDER BY version DESC LIMIT 1",
            [task_id],
        )
        return TaskRetryDecided.model_validate(rows[0]["payload"]) if rows else None


async def run(ctx: ServiceContext, stop: asyncio.Event, settings: RetrySettings) -> None:
    engine = RetryEngine(ctx.store, settings.config())
    await serve(ctx.nc, [routes(engine.handle)], stop)


def routes(failures: Handle[EventEnvelope]) -> Routes:
    """The retry engine's subscriber (handlers as arguments: see heteroflow/asyncapi.py)."""
    r = Routes("retry-engine")
    r.durable(
        EventEnvelope,
        failures,
        stream=EVENTS_STREAM,
        durable="retry-engine",
        subject=f"{EVENTS_PREFIX}.task.{{task_id}}.task_status_changed",
        description="Decides retry or give-up for each task that failed.",
    )
    return r
