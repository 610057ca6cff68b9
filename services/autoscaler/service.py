"""`heteroflow service autoscaler`: the leader-only scaling controllers of one process.

Two controllers, each under its own lease with fenced writes: the AutoScaler (scaler.py,
lease `autoscaler`) and the schedule-window controller (windows.py, lease
`schedule-windows`). Every instance listens to the router's figures (metrics.py); only the
one holding the `autoscaler` lease acts on them.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

from pydantic import Field

from libs.bus.broker import serve
from libs.bus.lease import Lease, open_lease_bucket
from libs.config import CommonSettings
from libs.controller import Controller, run_controller
from libs.domain.autoscale import DRAIN_LIMIT_S, MIN_REPLICA_AGE_S
from libs.domain.router_figures import RouterFigures
from libs.service import ServiceContext

from .metrics import routes
from .scaler import AutoScaler
from .windows import WindowController

LEASE_TTL_S = 6.0


class AutoscalerSettings(CommonSettings):
    window_interval_s: float = Field(
        default=60.0, gt=0, description="schedule-window evaluation period"
    )
    autoscale_interval_s: float = Field(
        default=30.0, gt=0, description="AutoScaler evaluation period"
    )
    autoscale_metric_max_age_s: float = Field(
        default=30.0,
        gt=0,
        description="a gateway's router figures older than this no longer count",
    )
    autoscale_utilization_window_s: float = Field(
        default=60.0, gt=0, description="gpu_utilization: mean over the samples of this window"
    )
    autoscale_min_replica_age_s: float = Field(
        default=MIN_REPLICA_AGE_S, ge=0, description="a scale-down never removes a younger replica"
    )
    autoscale_drain_limit_s: float = Field(
        default=DRAIN_LIMIT_S, gt=0, description="a replica draining longer than this is ended"
    )
    instance_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:8])


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
    return {"autoscaler": scaler, "schedule-windows": windows}


async def run(ctx: ServiceContext, stop: asyncio.Event, settings: AutoscalerSettings) -> None:
    kv = await open_lease_bucket(ctx.js, LEASE_TTL_S)
    me = f"{ctx.name}-{settings.instance_id}"
    book = RouterFigures(settings.autoscale_metric_max_age_s)
    jobs = [
        run_controller(
            controller,
            Lease(kv, lease, me, LEASE_TTL_S),
            stop,
            renew_every=LEASE_TTL_S / 3,
            claim=ctx.store.claim_fence,
        )
        for lease, controller in controllers(ctx, settings, book).items()
    ]
    await asyncio.gather(serve(ctx.nc, [routes(book)], stop), *jobs)
