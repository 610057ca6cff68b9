"""Apply what agents report: registrations and task facts, through the store's CAS.

A stale report (its expected status is no longer the task's) is refused like any CAS miss
and logged; the same fact is then applied from the current status, so an exit after a stop
request records `stopped`, never `completed`. A container running for a task that is no
longer this node's (an agent back after its tasks migrated) is told to stop.

Reports arrive in batches (`handle_batch`): the task reports of a batch are decided together
and committed in one transaction, in delivery order (a task's `starting` before its
`running`), each with its own compare-and-set; the stop commands for orphans go out
pipelined. Registrations, rare, are applied one by one where they stand in the batch.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import structlog
from nats.js import JetStreamContext

from libs import ordering
from libs.domain.errors import Conflict, DomainError, NotFound
from libs.domain.node.events import NodeRegistered
from libs.domain.node.model import Node
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
from libs.domain.task.lending import measure_sleep
from libs.domain.task.model import Task
from libs.domain.task.states import TaskStatus
from libs.store.eventstore import EventStore, Step
from libs.store.projections import NODES

from ..dispatch import send, send_all

Outcome = BaseException | None

log = structlog.get_logger(__name__)


# A sleep that freed at least this share of its cards' memory makes them lendable (seed 000:
# an engine's sleep releases 60-80 %); the scheduler's HETEROFLOW_LEND_MIN_RELEASED_FRACTION.
DEFAULT_MIN_RELEASED_FRACTION = 0.6


class ReportHandler:
    def __init__(
        self,
        store: EventStore,
        js: JetStreamContext,
        min_released_fraction: float = DEFAULT_MIN_RELEASED_FRACTION,
    ) -> None:
        self.store = store
        self.js = js
        self.min_released_fraction = min_released_fraction

    async def handle_batch(self, messages: list[NodeReport]) -> list[Outcome]:
        """A fetched batch in order: runs of task reports in one transaction each, the
        registrations between them alone. One outcome per message (None: done)."""
        if any(isinstance(m.root, Registration) for m in messages):
            ordering.unordered()  # several transactions: the next batch waits for all of them
        outcomes: list[Outcome] = []
        run: list[AgentReport] = []
        for message in messages:
            if isinstance(message.root, Registration):
                outcomes += await self.reports(run)
                run = []
                outcomes.append(await _outcome(self.register(message.root)))
            else:
                run.append(message.root)
        outcomes += await self.reports(run)
        return outcomes

    async def reports(self, reps: list[AgentReport]) -> list[Outcome]:
        """Task reports in one transaction, each its own compare-and-set (a miss is applied
        from the current status, as `report` does), then orphans told to stop."""
        if not reps:
            return []
        stale: dict[int, str] = {}
        steps = [_step(rep, self.min_released_fraction, stale, i) for i, rep in enumerate(reps)]
        results = await self.store.execute_steps(steps)
        for i, why in sorted(stale.items()):
            log.info("stale_report_refused", task_id=reps[i].task_id, error=why)
        orphans: list[NodeCommand] = []
        for rep, result in zip(reps, results, strict=True):
            if isinstance(result, NotFound):
                log.warning("report_for_unknown_task", task_id=rep.task_id, node_id=rep.node_id)
            elif isinstance(result, Task):
                orphans += _orphan_stop(result, rep)
        failed = await send_all(self.js, orphans)
        by_task = {cmd.task_id: exc for cmd, exc in zip(orphans, failed, strict=True) if exc}
        # A report whose orphan stop did not go out is handled again (the stop is resent).
        outcomes: list[Outcome] = []
        for rep, result in zip(reps, results, strict=True):
            if isinstance(result, DomainError) and not isinstance(result, NotFound):
                outcomes.append(result)  # not a CAS miss (those reconcile): try again
            else:
                outcomes.append(by_task.get(rep.task_id))
        return outcomes

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
                lambda t: _decided(t, rep, self.min_released_fraction),
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
        for cmd in _orphan_stop(task, rep):
            await send(self.js, cmd)


def _decided(task: Task, rep: AgentReport, min_released_fraction: float) -> list[Any]:
    """The report's transition; for a sleep, the evidence of what it released (lending)."""
    events: list[Any] = list(decide_report(task, rep))
    same = rep.attempt == task.attempt and rep.node_id == task.node_id
    if rep.fact is Fact.PAUSED and same and task.status is TaskStatus.SLEEPING:
        events.append(
            measure_sleep(
                task,
                rep.node_id,
                rep.sleep_mode,
                rep.vram_before_mb,
                rep.vram_after_mb,
                min_released_fraction,
            )
        )
    return events


def _step(rep: AgentReport, min_released_fraction: float, stale: dict[int, str], i: int) -> Step:
    """Report `i` of a batch as a store step. Why a report was stale goes into `stale` and is
    logged once the batch has committed: the store may decide a step twice (first on the
    document it holds, then on the locked row, eventstore `_known_steps`), and only the
    decision that was written is the report's."""

    def decide(task: Task) -> list[Any]:
        stale.pop(i, None)
        try:
            return _decided(task, rep, min_released_fraction)
        except Conflict as exc:
            stale[i] = exc.message
            return list(decide_reconcile(task, rep))

    return rep.task_id, decide, {"node_id": rep.node_id, "fact": rep.fact.value}


def _orphan_stop(task: Task, rep: AgentReport) -> list[NodeCommand]:
    """A stop for a container that runs for a task no longer this node's (or attempt's)."""
    orphan = task.node_id != rep.node_id or task.attempt != rep.attempt
    if not orphan or rep.fact not in (Fact.STARTING, Fact.RUNNING, Fact.RESUMED, Fact.PAUSED):
        return []
    log.warning("orphan_container_stopped", task_id=rep.task_id, node_id=rep.node_id)
    return [
        NodeCommand(
            kind=CommandKind.STOP,
            node_id=rep.node_id,
            task_id=rep.task_id,
            attempt=rep.attempt,
            status=TaskStatus.STOPPING,
            grace_s=5.0,
        )
    ]


async def _outcome(work: Awaitable[Any]) -> Outcome:
    try:
        await work
    except Exception as exc:
        log.exception("registration_failed")
        return exc
    return None
