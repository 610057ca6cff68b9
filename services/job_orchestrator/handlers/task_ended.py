"""A task of a job ended for good: settle its job node and ready its dependants; and what a
job hears of its tasks before that (admitted and placed, pending again, why one waits), from
which its status is folded (`job.decide.progress`).

A task's end is final on `completed`, `cancelled` or `stopped`, and on `failed` only once the
retry engine gave up (`task_retry_decided` with action give_up or hold): a job's retries are
each task's smart-retry rules. The settlement, the cascade (`job_state.advance`) and the new
tasks commit in one transaction with the consumer's receipt, so a redelivered event changes
nothing (libs/store/inbox.py).
"""

from __future__ import annotations

from collections import OrderedDict

import structlog
from prometheus_client import Counter

from libs.bus.typed import EventHandlers
from libs.domain.envelope import EventEnvelope
from libs.domain.errors import NotFound
from libs.domain.job.decide import cascade, parse_report, progress
from libs.domain.job.events import JobNodeProgress, JobNodeSettled
from libs.domain.job.evolve import evolve_job
from libs.domain.job.model import DONE, Job, NodeState
from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.task.events import (
    TaskCreated,
    TaskPendingReason,
    TaskRetryDecided,
    TaskStatusChanged,
)
from libs.domain.task.states import TERMINAL, TaskStatus
from libs.ownership import foreign_job_task, refuse_foreign
from libs.store import inbox
from libs.store import tasks as task_rows
from libs.store.eventstore import EventStore, NewTask, new_task_id
from libs.store.projections import JOBS

from ..routes import CONSUMER

log = structlog.get_logger(__name__)

SETTLED = Counter("heteroflow_job_tasks_settled_total", "Job tasks ended for good", ["outcome"])

_ENDED = {
    TaskStatus.COMPLETED: NodeState.COMPLETED,
    TaskStatus.CANCELLED: NodeState.STOPPED,
    TaskStatus.STOPPED: NodeState.STOPPED,
}


def status_outcome(ev: TaskStatusChanged) -> NodeState | None:
    """The final outcome a status change announces, or None (not an end for good)."""
    return _ENDED.get(ev.to_status)


def retry_outcome(ev: TaskRetryDecided) -> NodeState | None:
    """A retry decision other than retry ends the task for good, as failed."""
    return NodeState.FAILED if ev.action != "retry" else None


def is_news(ev: TaskStatusChanged) -> bool:
    """A change the job's status may turn on: a task back to pending, or leaving pending for
    a placement (moves among placed statuses, and ends, are not news here)."""
    placed = ev.from_status is TaskStatus.PENDING and ev.to_status not in TERMINAL
    return ev.to_status is TaskStatus.PENDING or placed


# Tasks whose job (or none) this process remembers: a task's job never changes (written
# once, at its creation), and most tasks belong to none.
JOB_OF_KEPT = 65_536


class Orchestrator:
    def __init__(self, store: EventStore, kept: int = JOB_OF_KEPT) -> None:
        self.store = store
        self._job_of: OrderedDict[str, str] = OrderedDict()
        self._kept = kept
        self.handlers = EventHandlers.of(
            self.on_created,
            self.on_status_changed,
            self.on_retry_decided,
            self.on_pending_reason,
            owner=CONSUMER,
        )

    async def handle(self, envelope: EventEnvelope) -> None:
        """One envelope off the bus: parsed, then handled if a handler takes its type."""
        await self.handlers(envelope)

    async def on_created(self, _env: EventEnvelope, ev: TaskCreated) -> None:
        """A task's job (or none) is in its creation event: remembered here, its later events
        need no read of the row (a task's events come in order on this consumer; one that
        comes first, or a task forgotten since, is read as before)."""
        self._remember(ev.task_id, ev.spec.platform.job_id)

    async def on_status_changed(self, env: EventEnvelope, ev: TaskStatusChanged) -> None:
        if (outcome := status_outcome(ev)) is not None:
            await self.settle(env, ev.task_id, outcome)
        elif is_news(ev):
            await self.hear(env, ev.task_id, ev.to_status, ev.reason_code, ev.reason)

    async def on_pending_reason(self, env: EventEnvelope, ev: TaskPendingReason) -> None:
        await self.hear(env, ev.task_id, TaskStatus.PENDING, ev.reason_code, ev.reason)

    async def hear(
        self,
        env: EventEnvelope,
        task_id: str,
        status: TaskStatus,
        code: ReasonCode,
        reason: str,
    ) -> None:
        """Record on the task's job what happened to it, and the job's status that follows."""
        if not await self.in_a_job(task_id):
            return
        try:
            task = await self.store.get_task(task_id, include_deleted=True)
        except NotFound:
            return
        job_id, key = task.spec.platform.job_id, task.spec.platform.job_key
        if not job_id:
            return
        heard = JobNodeProgress(
            job_id=job_id,
            key=key,
            task_id=task.id,
            task_status=status,
            task_version=env.version,
            reason_code=code,
            reason=reason,
        )

        def decide(job: Job | None) -> list[Payload]:
            return [] if job is None or job.tenant_id != task.tenant_id else progress(job, heard)

        await self.store.execute_aggregate(
            JOBS,
            job_id,
            decide,
            metadata={"actor": "job_orchestrator"},
            receipt=inbox.Receipt(CONSUMER, env.event_id),
        )

    async def on_retry_decided(self, env: EventEnvelope, ev: TaskRetryDecided) -> None:
        if (outcome := retry_outcome(ev)) is not None:
            await self.settle(env, ev.task_id, outcome)

    async def in_a_job(self, task_id: str) -> bool:
        """Whether the task was created for a job. Every event of every task comes here:
        after the first, a task's answer is remembered, not read again with its document."""
        job_id = self._job_of.get(task_id)
        if job_id is None:
            found = await task_rows.job_of(self.store, task_id)
            if found is None:
                return False  # no such task
            job_id = self._remember(task_id, found)
        return bool(job_id)

    def _remember(self, task_id: str, job_id: str) -> str:
        self._job_of[task_id] = job_id
        if len(self._job_of) > self._kept:
            self._job_of.popitem(last=False)
        return job_id

    async def settle(self, env: EventEnvelope, task_id: str, outcome: NodeState) -> None:
        if not await self.in_a_job(task_id):
            return
        try:
            task = await self.store.get_task(task_id, include_deleted=True)
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
            receipt=inbox.Receipt(CONSUMER, env.event_id),
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
