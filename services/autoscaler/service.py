"""`heteroflow service autoscaler`: the leader-only scaling controllers of one process.

Today it runs the schedule-window controller (windows.py) under the `schedule-windows`
lease; the AutoScaler proper is not built yet (docs/status.md).
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

from pydantic import Field

from libs.bus.lease import Lease, open_lease_bucket
from libs.config import CommonSettings
from libs.controller import run_controller
from libs.service import ServiceContext

from .windows import WindowController

LEASE_TTL_S = 6.0


class AutoscalerSettings(CommonSettings):
    window_interval_s: float = Field(
        default=60.0, gt=0, description="schedule-window evaluation period"
    )
    instance_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:8])


def wall_clock() -> datetime:
    return datetime.now(UTC)


async def run(ctx: ServiceContext, stop: asyncio.Event, settings: AutoscalerSettings) -> None:
    kv = await open_lease_bucket(ctx.js, LEASE_TTL_S)
    me = f"{ctx.name}-{settings.instance_id}"
    windows = WindowController(ctx.store, wall_clock, interval_s=settings.window_interval_s)
    lease = Lease(kv, "schedule-windows", me, LEASE_TTL_S)
    await run_controller(
        windows, lease, stop, renew_every=LEASE_TTL_S / 3, claim=ctx.store.claim_fence
    )
