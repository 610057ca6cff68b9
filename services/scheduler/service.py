"""The scheduler service: placement, node monitor and group controller (leader-only, each on
the controller runtime with its own lease: controllers/), command dispatch and agent reports
(competing durable consumers: handlers/), all bound to the bus in routes.py."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import structlog

from libs.bus.broker import serve
from libs.bus.lease import Lease, open_lease_bucket
from libs.controller import Controller, run_controller
from libs.service import ServiceContext
from libs.store.fencing import lease_floor

from . import view
from .controllers.groups import GroupController, policy_from
from .controllers.node_monitor import NodeMonitor
from .controllers.placement import PlacementController, Placer
from .handlers.dispatch import Dispatcher
from .handlers.reports import ReportHandler
from .handlers.wake import PlacerWake
from .routes import routes
from .settings import SchedulerSettings

log = structlog.get_logger(__name__)

LEASE_TTL_S = 6.0


async def run(ctx: ServiceContext, stop: asyncio.Event, settings: SchedulerSettings) -> None:
    kv = await open_lease_bucket(ctx.js, LEASE_TTL_S, floor=await lease_floor(ctx.store))
    wake = asyncio.Event()
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
        quarantine_probes=settings.quarantine_probes,
        quarantine_probe_interval_s=settings.quarantine_probe_interval_s,
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
        # `store=`: each term claims its fence there and gets its writer (`term.writer`).
        lease = Lease(kv, lease_name, me, LEASE_TTL_S)
        return run_controller(controller, lease, stop, renew_every=LEASE_TTL_S / 3, store=ctx.store)

    dispatcher = Dispatcher(ctx.store, ctx.js)
    reports = ReportHandler(ctx.store, ctx.js, settings.lend_min_released_fraction)
    woken = PlacerWake(placer, wake)
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
                    wake_on_task=woken.on_task_event,
                    wake_on_node=woken.on_node_event,
                )
            ],
            stop,
        ),
    ]
    await asyncio.gather(*jobs)


__all__ = ["LEASE_TTL_S", "SchedulerSettings", "routes", "run"]
