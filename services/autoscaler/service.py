"""`heteroflow service autoscaler`: the leader-only scaling controllers of one process.

Three controllers (controllers/), each under its own lease, every write through its term's
`FencedWriter`: the AutoScaler (lease `autoscaler`), the schedule-window controller (lease
`schedule-windows`) and idle sleep (lease `idle-sleep`). Every instance listens to the
router's figures (routes.py); only the leaders act on them.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from libs.bus.broker import serve
from libs.bus.lease import Lease, open_lease_bucket
from libs.controller import Controller, run_controller
from libs.domain.group.router_figures import RouterFigures
from libs.service import ServiceContext
from libs.store.fencing import lease_floor

from .controllers.idle_sleep import IdleSleeper
from .controllers.scaler import AutoScaler
from .controllers.windows import WindowController
from .routes import routes
from .settings import AutoscalerSettings

__all__ = ["LEASE_TTL_S", "AutoscalerSettings", "controllers", "routes", "run"]

LEASE_TTL_S = 6.0


def wall_clock() -> datetime:
    return datetime.now(UTC)


def controllers(
    ctx: ServiceContext, settings: AutoscalerSettings, book: RouterFigures
) -> dict[str, Controller]:
    """Lease name → controller."""
    scaler = AutoScaler(
        ctx.store,
        book,
        wall_clock,
        interval_s=settings.autoscale_interval_s,
        utilization_window_s=settings.autoscale_utilization_window_s,
        min_replica_age_s=settings.autoscale_min_replica_age_s,
        drain_limit_s=settings.autoscale_drain_limit_s,
    )
    windows = WindowController(ctx.store, wall_clock, interval_s=settings.window_interval_s)
    idle = IdleSleeper(
        ctx.store,
        book,
        wall_clock,
        interval_s=settings.idle_sleep_interval_s,
        minute_s=settings.serve_idle_minute_s,
        listen_s=settings.idle_sleep_listen_s,
    )
    return {"autoscaler": scaler, "schedule-windows": windows, "idle-sleep": idle}


async def run(ctx: ServiceContext, stop: asyncio.Event, settings: AutoscalerSettings) -> None:
    kv = await open_lease_bucket(ctx.js, LEASE_TTL_S, floor=await lease_floor(ctx.store))
    me = f"{ctx.name}-{settings.instance_id}"
    book = RouterFigures(settings.autoscale_metric_max_age_s)
    jobs = [
        run_controller(
            controller,
            Lease(kv, lease, me, LEASE_TTL_S),
            stop,
            renew_every=LEASE_TTL_S / 3,
            store=ctx.store,
        )
        for lease, controller in controllers(ctx, settings, book).items()
    ]
    await asyncio.gather(serve(ctx.nc, [routes(book)], stop), *jobs)
