"""What the api-gateway publishes on the bus: the serving router's request figures."""

from __future__ import annotations

from libs.bus.broker import Routes
from libs.bus.subjects import SERVING_PREFIX
from libs.domain.group.serving import ServingMetrics


def routes(target: str = "{target_id}") -> Routes:
    r = Routes("api-gateway")
    r.publishes(
        ServingMetrics,
        subject=f"{SERVING_PREFIX}.{target}.metrics",
        description="Requests/s, concurrency, latency p95, queue depth and idle seconds of "
        "one serving target as one gateway process measured them (core NATS; "
        "docs/serving.md): the autoscaler scales and sleeps idle targets from them.",
    )
    return r
