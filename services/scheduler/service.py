"""The scheduler service: placement, node monitor and group controller (leader-only, each on
the controller runtime with its own lease), command dispatch and agent reports (competing
durable consumers)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine
from typing import Any

import structlog
from pydantic import Field

from libs.bus.broker import serve
from libs.bus.lease import Lease, open_lease_bucket
from libs.config import CommonSettings
from libs.controller import Controller, run_controller
from libs.domain.envelope import EventEnvelope
from libs.service import ServiceContext

from . import view
from .dispatch import Dispatcher
from .groups import GroupController, policy_from
from .monitor import NodeMonitor
from .placement import (
    PlacementController,
    Placer,
    changes_holding,
    frees_a_start,
    wakes_placement,
)
from .planner import DEFAULT_MAX_CANDIDATES
from .reports import DEFAULT_MIN_RELEASED_FRACTION, ReportHandler
from .routes import routes

log = structlog.get_logger(__name__)

LEASE_TTL_S = 6.0
# Twice the agent's default HETEROFLOW_AGENT_MAX_CONCURRENT_COMMANDS (32): the agent always
# has its next commands queued, and a burst is not committed whole to one node.
DEFAULT_MAX_STARTING_PER_NODE = 64


class SchedulerSettings(CommonSettings):
    node_offline_after_s: float = Field(default=10.0, description="heartbeat silence → offline")
    node_gone_after_s: float = Field(default=600.0, description="offline this long → gone")
    task_unconfirmed_after_s: float = Field(
        default=300.0, gt=0, description="a task its node has not listed this long is resolved"
    )
    schedule_batch: int = 512
    schedule_max_candidates: int = Field(
        default=DEFAULT_MAX_CANDIDATES, ge=0, description="fits scored per task; 0 = all"
    )
    schedule_max_starting_per_node: int = Field(
        default=DEFAULT_MAX_STARTING_PER_NODE,
        ge=0,
        description="tasks scheduled or starting (not yet running) on one node; 0 = no bound",
    )
    group_scan_interval_s: float = 2.0
    liveness_floor_s: float = Field(
        default=900.0, gt=0, description="inference task with no positive liveness this long"
    )
    liveness_stale_s: float = Field(
        default=30.0, gt=0, description="heartbeat evidence older than this is a death signal"
    )
    group_rebuild_scan_s: float = Field(default=10.0, description="inference rebuild scan")
    group_restart_backoffs_s: list[float] = Field(default_factory=lambda: [60.0, 180.0])
    group_restart_window_s: float = 600.0
    group_restart_give_up_s: float = 1800.0
    group_max_rebuilds: int = 5
    group_replica_max_restarts: int = Field(
        default=5, ge=0, description="replica self-heals per rank within the crash window"
    )
    group_replica_crash_window_s: float = Field(
        default=600.0, gt=0, description="failures of a rank counted for the crash-loop cap"
    )
    group_replica_backoff_s: float = Field(
        default=10.0, ge=0, description="wait before the 2nd replacement, doubling after"
    )
    group_replica_backoff_max_s: float = Field(default=300.0, ge=0, description="backoff cap")
    lend_min_released_fraction: float = Field(
        default=DEFAULT_MIN_RELEASED_FRACTION,
        gt=0,
        le=1,
        description="share of its cards' memory a sleep must release for them to be lent",
    )
    instance_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:8])


async def run(ctx: ServiceContext, stop: asyncio.Event, settings: SchedulerSettings) -> None:
    kv = await open_lease_bucket(ctx.js, LEASE_TTL_S)
    wake = asyncio.Event()

    async def on_task_event(envelope: EventEnvelope) -> None:
        kind, payload = envelope.type, envelope.payload
        starts_freed = placer.waiting_on_starts and frees_a_start(kind, payload)
        if starts_freed or changes_holding(kind, payload):
            placer.cluster.invalidate()
        if starts_freed or wakes_placement(kind, payload):
            wake.set()

    async def on_node_event(_envelope: EventEnvelope) -> None:
        placer.cluster.invalidate()
        wake.set()

    placer = Placer(
        ctx.store,
        ctx.store.clock,
        batch=settings.schedule_batch,
        max_candidates=settings.schedule_max_candidates or None,
        cluster=view.ClusterView(settings.schedule_max_starting_per_node),
    )
    monitor = NodeMonitor(
        ctx.store,
        ctx.nc,
        offline_after_s=settings.node_offline_after_s,
        gone_after_s=settings.node_gone_after_s,
        liveness_floor_s=settings.liveness_floor_s,
        liveness_stale_s=settings.liveness_stale_s,
        unconfirmed_after_s=settings.task_unconfirmed_after_s,
    )
    groups = GroupController(
        ctx.store,
        policy_from(
            settings.group_restart_backoffs_s,
            settings.group_restart_window_s,
            settings.group_restart_give_up_s,
            settings.group_max_rebuilds,
            replica_max_restarts=settings.group_replica_max_restarts,
            replica_crash_window_s=settings.group_replica_crash_window_s,
            replica_backoff_s=settings.group_replica_backoff_s,
            replica_backoff_max_s=settings.group_replica_backoff_max_s,
        ),
        ctx.store.clock,
        interval_s=settings.group_scan_interval_s,
        rebuild_every_s=settings.group_rebuild_scan_s,
    )

    me = f"{ctx.name}-{settings.instance_id}"

    def lead(lease_name: str, controller: Controller) -> Coroutine[Any, Any, None]:
        lease = Lease(kv, lease_name, me, LEASE_TTL_S)
        return run_controller(
            controller, lease, stop, renew_every=LEASE_TTL_S / 3, claim=ctx.store.claim_fence
        )

    dispatcher = Dispatcher(ctx.store, ctx.js)
    reports = ReportHandler(ctx.store, ctx.js, settings.lend_min_released_fraction)
    jobs = [
        lead("scheduler", PlacementController(placer, wake)),
        lead("node-monitor", monitor),
        lead("group-controller", groups),
        serve(
            ctx.nc,
            [
                routes(
                    dispatch=dispatcher.handle_batch,
                    reports=reports.handle_batch,
                    heartbeat=monitor.heartbeat,
                    wake_on_task=on_task_event,
                    wake_on_node=on_node_event,
                )
            ],
            stop,
        ),
    ]
    await asyncio.gather(*jobs)
