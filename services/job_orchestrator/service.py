"""The job-orchestrator service: a task of a job ended for good, so its dependants move.

Orchestration is not scheduling (seed 004): this service only decides which tasks of a job
exist; the scheduler places them, after queue quota and pool capacity, like any task.
Event-driven: nothing polls. Wiring only: the consumer is `handlers/task_ended.py`, the
subscriber `routes.py`.
"""

from __future__ import annotations

import asyncio

from libs.bus.broker import serve
from libs.periodic import periodic
from libs.service import ServiceContext
from libs.store import inbox

from .handlers.task_ended import Orchestrator
from .routes import CONSUMER, routes
from .settings import OrchestratorSettings

INBOX_PURGE_INTERVAL_S = 3600.0


async def run(
    ctx: ServiceContext, stop: asyncio.Event, settings: OrchestratorSettings | None = None
) -> None:
    orchestrator = Orchestrator(ctx.store)

    async def purge() -> None:
        await inbox.purge(ctx.store, CONSUMER)

    await asyncio.gather(
        serve(ctx.nc, [routes(orchestrator.handlers)], stop),
        periodic("inbox_purge", purge, stop, INBOX_PURGE_INTERVAL_S),
    )


__all__ = ["CONSUMER", "Orchestrator", "OrchestratorSettings", "routes", "run"]
