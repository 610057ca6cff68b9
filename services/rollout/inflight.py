"""What the routers say is in flight on each replica, and which replicas pass their health.

The routers publish their figures for every serving target on `hf.serving.<target>.metrics`
(core NATS, every `HETEROFLOW_SERVE_METRICS_INTERVAL_S`), with the in-flight requests of each
replica and the replicas they know are draining; a `RouterFigures` book
(libs/domain/router_figures.py) keeps them, and a draining replica is done when it is
`drained` there. Health is probed here the way the router probes it:
`GET <serve_address><health_path>` answering 2xx.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import httpx

from libs.bus.broker import Routes
from libs.bus.subjects import SERVING_PREFIX
from libs.domain.router_figures import RouterFigures
from libs.domain.serving import ServingMetrics
from libs.domain.states import TaskStatus
from libs.domain.task import Task

# A router silent this long about a target no longer routes to it (or has gone).
ROUTER_SILENT_S = 30.0


def routes(figures: RouterFigures | None = None) -> Routes:
    """The rollout service's subscription (documented in docs/asyncapi.json)."""

    async def ignore(_: ServingMetrics) -> None:
        return None

    r = Routes("rollout")
    r.core(
        ServingMetrics,
        figures.hear if figures is not None else ignore,
        subject=f"{SERVING_PREFIX}.*.metrics",
        description="The routers' figures with each replica's in-flight requests: a draining "
        "replica is ended once none is in flight (at most 15 s).",
    )
    return r


class HealthProbe:
    """Which running replicas answer their health path with 2xx."""

    def __init__(self, timeout_s: float = 2.0) -> None:
        self.client = httpx.AsyncClient(timeout=timeout_s, trust_env=False)

    async def close(self) -> None:
        await self.client.aclose()

    async def healthy(self, tasks: Iterable[Task]) -> frozenset[str]:
        running = [t for t in tasks if t.status is TaskStatus.RUNNING]
        results = await asyncio.gather(*(self._one(t) for t in running))
        return frozenset(t.id for t, ok in zip(running, results, strict=True) if ok)

    async def _one(self, task: Task) -> bool:
        serving = task.spec.serving
        if serving is None:
            return True  # nothing to probe: running is healthy
        if not task.serve_address:
            return False
        try:
            resp = await self.client.get(f"http://{task.serve_address}{serving.health_path}")
        except httpx.HTTPError:
            return False
        return 200 <= resp.status_code < 300
