"""What the api-gateway publishes on the bus: the serving router's request figures."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from libs.bus.broker import Routes
from libs.bus.subjects import SERVING_PREFIX
from libs.domain.serving import ServingMetrics


async def _ignore(_: ServingMetrics) -> None:
    return None


def routes(
    on_metrics: Callable[[ServingMetrics], Awaitable[None]] = _ignore,
    target: str = "{target_id}",
) -> Routes:
    r = Routes("api-gateway")
    r.core(
        ServingMetrics,
        on_metrics,
        subject=f"{SERVING_PREFIX}.*.metrics",
        description="The other gateway processes' figures: a request another process routed "
        "keeps a target from being slept as idle here.",
    )
    r.publishes(
        ServingMetrics,
        subject=f"{SERVING_PREFIX}.{target}.metrics",
        description="Requests/s, concurrency, latency p95 and queue depth of one serving "
        "target as one gateway process measured them (core NATS; docs/serving.md).",
    )
    return r
