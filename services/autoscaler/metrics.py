"""What the AutoScaler hears: the router's request figures per serving target.

Every gateway process publishes its own figures for each target it routes to on
`hf.serving.<target>.metrics` (core NATS, every `HETEROFLOW_SERVE_METRICS_INTERVAL_S`). The
book keeps the latest message of each (target, gateway) and forgets one older than
`max_age_s`, so a gateway that stopped publishing no longer counts. Every AutoScaler
instance listens (cheap), only the leader reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from libs.bus.broker import Routes
from libs.bus.subjects import SERVING_PREFIX
from libs.domain.serving import ServingMetrics


class MetricBook:
    def __init__(self, max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self.clock = clock
        self._latest: dict[str, dict[str, tuple[float, ServingMetrics]]] = {}

    async def hear(self, m: ServingMetrics) -> None:
        self.record(m)

    def record(self, m: ServingMetrics) -> None:
        self._latest.setdefault(m.target_id, {})[m.gateway] = (self.clock(), m)

    def samples(self, target_id: str) -> list[ServingMetrics]:
        """The fresh figures of `target_id`, one per gateway process."""
        now = self.clock()
        by_gateway = self._latest.get(target_id, {})
        for gateway, (heard, _) in list(by_gateway.items()):
            if now - heard > self.max_age_s:
                del by_gateway[gateway]
        return [m for _, m in by_gateway.values()]


def routes(book: MetricBook | None = None) -> Routes:
    async def ignore(_: ServingMetrics) -> None:
        return None

    r = Routes("autoscaler")
    r.core(
        ServingMetrics,
        book.hear if book is not None else ignore,
        subject=f"{SERVING_PREFIX}.*.metrics",
        description="The router's figures per serving target and gateway process: the "
        "AutoScaler's qps, concurrency, latency_p95_ms and queue_depth (docs/autoscaling.md).",
    )
    return r
