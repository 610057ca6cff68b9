"""The job-orchestrator service: a task of a job ended for good, so its dependants move.

Orchestration is not scheduling (seed 004): this service only decides which tasks of a job
exist; the scheduler places them, after queue quota and pool capacity, like any task.

A task's end is final on `completed`, `cancelled` or `stopped`, and on `failed` only once the
retry engine gave up (`task_retry_decided` with action give_up or hold): a job's retries are
each task's smart-retry rules. The settlement, the cascade (`job_state.advance`) and the new
tasks commit in one transaction with the consumer's receipt, so a redelivered event changes
nothing (libs/store/inbox.py). Event-driven: nothing polls.
"""

from __future__ import annotations

import asyncio

import structlog
from prometheus_client import Counter

from libs.bus.broker import Handle, Routes, serve
from libs.bus.subjects import EVENTS_PREFIX, EVENTS_STREAM
from libs.domain.envelope import EventEnvelope
from libs.domain.errors import NotFound
from libs.domain.events import Payload
from libs.domain.job_state import (
    DONE,
    Job,
    JobNodeSettled,
    NodeState,
    cascade,
    evolve_job,
    parse_report,
)
from libs.ownership import foreign_job_task, refuse_foreign
from libs.periodic import periodic
from libs.service import ServiceContext
from libs.store import inbox
from libs.store.eventstore import EventStore, NewTask, new_task_id
from libs.store.projections import JOBS

log = structlog.get_logger(__name__)

CONSUMER = "job-orchestrator"
INBOX_PURGE_INTERVAL_S = 3600.0
SETTLED = Counter("heteroflow_job_tasks_settled_total", "Job tasks ended for good", ["outcome"])

_ENDED = {
    "completed": NodeState.COMPLETED,
    "cancelled": NodeState.STOPPED,
    "stopped": NodeState.STOPPED,
}


def outcome_of(envelope: EventEnvelope) -> NodeState | None:
    """The final outcome this task event announces, or None (not final, or not an end)."""
    payload = envelope.payload
    if envelope.type == "task_status_changed":
        return _ENDED.get(str(payload.get("to_status")))
    if envelope.type == "task_retry_decided" and payload.get("action") != "retry":
        return NodeState.FAILED
    return None


class Orchestrator:
    def __init__(self, store: EventStore) -> None:
        self.store = store

    async def handle(self, envelope: EventEnvelope) -> None:
        outcome = outcome_of(envelope)
        if outcome is None:
            return
        try:
            task = await self.store.get_task(envelope.payload["task_id"], include_deleted=True)
        except NotFound:
            return
        job_id = task.spec.platform.job_id
        key = task.spec.platform.job_key
        if not job_id:
            return
        metrics, artifacts = parse_report(task.result)
        settled = JobNodeSettled(
            job_id=job_id,
            key=key,
            task_id=task.id,
            outcome=outcome,
            metrics=metrics,
            artifacts=artifacts,
        )

        refused: list[str] = []

        def decide(job: Job | None) -> tuple[list[Payload], list[NewTask]]:
            node = job.nodes.get(key) if job else None
            if job is None or node is None:
                refused.append("no such job or node")
                return [], []
            if why := foreign_job_task(job, node, task):
                refused.append(why)
                return [], []
            if node.state in DONE:
                return [], []  # settled already (idempotent)
            after = evolve_job(job, settled, self.store.clock(), job.version + 1)
            events, ready = cascade(after, new_task_id)
            new: list[NewTask] = [(job.tenant_id, spec, None, None, i) for i, spec in ready]
            return [settled, *events], new

        job, created = await self.store.execute_with_tasks(
            JOBS,
            job_id,
            decide,
            metadata={"actor": "job_orchestrator"},
            receipt=inbox.Receipt(CONSUMER, envelope.event_id),
        )
        if refused:
            refuse_foreign(
                "job_task",
                refused[0],
                job_id=job_id,
                key=key,
                task_id=task.id,
                tenant_id=task.tenant_id,
            )
            return
        SETTLED.labels(outcome.value).inc()
        log.info(
            "job_task_settled",
            job_id=job_id,
            key=key,
            outcome=outcome.value,
            created=[t.id for t in created],
            job_status=job.status.value if job else None,
        )


async def run(ctx: ServiceContext, stop: asyncio.Event) -> None:
    orchestrator = Orchestrator(ctx.store)

    async def purge() -> None:
        await inbox.purge(ctx.store, CONSUMER)

    await asyncio.gather(
        serve(ctx.nc, [routes(orchestrator.handle)], stop),
        periodic("inbox_purge", purge, stop, INBOX_PURGE_INTERVAL_S),
    )


def routes(task_events: Handle[EventEnvelope]) -> Routes:
    """The orchestrator's subscriber (handlers as arguments: see heteroflow/asyncapi.py)."""
    r = Routes("job-orchestrator")
    r.durable(
        EventEnvelope,
        task_events,
        stream=EVENTS_STREAM,
        durable=CONSUMER,
        subject=f"{EVENTS_PREFIX}.task.{{task_id}}.{{event_type}}",
        description="Task events; a job task's final end settles it and readies its dependants.",
        deliver_new=True,
    )
    return r
