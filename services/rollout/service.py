"""`heteroflow service rollout`: the rollout controller (leader-only) and its inputs.

One process leads at a time (the `rollout` lease in NATS KV, every write through its term's
`FencedWriter`); it hears the routers' in-flight figures on the bus (routes.py) and probes
new replicas' health itself (inflight.py). Settings are `HETEROFLOW_ROLLOUT_*`
(settings.py, docs/rollout.md).
"""

from __future__ import annotations

import asyncio
import os
import socket
from datetime import UTC, datetime

from libs.bus.broker import serve
from libs.bus.lease import Lease, open_lease_bucket
from libs.controller import run_controller
from libs.domain.group.router_figures import RouterFigures
from libs.service import ServiceContext
from libs.store.fencing import lease_floor

from .controllers.rollout import RolloutController
from .inflight import ROUTER_SILENT_S, HealthProbe
from .routes import routes
from .settings import RolloutSettings

__all__ = ["LEASE_TTL_S", "RolloutSettings", "routes", "run"]

LEASE_TTL_S = 6.0  # the controller's leadership lease (not the group's rollout lease)


def wall_clock() -> datetime:
    return datetime.now(UTC)


async def run(ctx: ServiceContext, stop: asyncio.Event, settings: RolloutSettings) -> None:
    kv = await open_lease_bucket(ctx.js, LEASE_TTL_S, floor=await lease_floor(ctx.store))
    # Unique per process: a restarted service is a new holder, and the old one's rollouts
    # are recovered (failed with the reason), not silently adopted.
    me = f"{ctx.name}-{socket.gethostname()}-{os.getpid()}-{settings.instance_id}"
    inflight = RouterFigures(ROUTER_SILENT_S)
    probe = HealthProbe()
    controller = RolloutController(
        ctx.store,
        wall_clock,
        me,
        settings.policy(),
        inflight,
        probe,
        interval_s=settings.rollout_interval_s,
    )
    lease = Lease(kv, "rollout", me, LEASE_TTL_S)
    try:
        await asyncio.gather(
            serve(ctx.nc, [routes(inflight)], stop),
            run_controller(controller, lease, stop, renew_every=LEASE_TTL_S / 3, store=ctx.store),
        )
    finally:
        await probe.close()
