"""`heteroflow service rollout`: the rollout controller (leader-only) and its inputs.

One process leads at a time (the `rollout` lease in NATS KV, every write fenced); it hears
the routers' in-flight figures on the bus and probes new replicas' health itself. Settings
are `HETEROFLOW_ROLLOUT_*` (docs/rollout.md); the defaults are the seed's numbers.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from datetime import UTC, datetime, timedelta

from pydantic import Field

from libs.bus.broker import serve
from libs.bus.lease import Lease, open_lease_bucket
from libs.config import CommonSettings
from libs.controller import run_controller
from libs.domain.rollout_plan import RolloutPolicy
from libs.domain.router_figures import RouterFigures
from libs.service import ServiceContext

from .controller import RolloutController
from .inflight import ROUTER_SILENT_S, HealthProbe, routes

LEASE_TTL_S = 6.0  # the controller's leadership lease (not the group's rollout lease)


class RolloutSettings(CommonSettings):
    rollout_interval_s: float = Field(default=1.0, gt=0, description="rollout controller pass")
    rollout_batch_retries: int = Field(
        default=3, ge=0, le=10, description="times a failed batch is tried again"
    )
    rollout_drain_timeout_s: float = Field(
        default=15.0, ge=0, description="longest wait for a draining replica's requests"
    )
    rollout_drain_min_s: float = Field(
        default=2.0, ge=0, description="least wait before a drained replica is ended"
    )
    rollout_lease_renew_s: float = Field(
        default=15.0, gt=0, description="how often the group's rollout lease is renewed"
    )
    rollout_lease_ttl_s: float = Field(default=60.0, gt=0, description="rollout lease TTL")
    rollout_recovery_after_s: float = Field(
        default=90.0,
        gt=0,
        description="a rollout whose holder has not renewed its lease this long is failed",
    )
    instance_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:8])

    def policy(self) -> RolloutPolicy:
        return RolloutPolicy(
            batch_retries=self.rollout_batch_retries,
            drain_timeout=timedelta(seconds=self.rollout_drain_timeout_s),
            drain_min=timedelta(seconds=self.rollout_drain_min_s),
            lease_renew=timedelta(seconds=self.rollout_lease_renew_s),
            lease_ttl=timedelta(seconds=self.rollout_lease_ttl_s),
            recovery_after=timedelta(seconds=self.rollout_recovery_after_s),
        )


def wall_clock() -> datetime:
    return datetime.now(UTC)


async def run(ctx: ServiceContext, stop: asyncio.Event, settings: RolloutSettings) -> None:
    kv = await open_lease_bucket(ctx.js, LEASE_TTL_S)
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
            run_controller(
                controller, lease, stop, renew_every=LEASE_TTL_S / 3, claim=ctx.store.claim_fence
            ),
        )
    finally:
        await probe.close()
