"""What the AutoScaler hears: the router's request figures per serving target.

Every gateway process publishes its own figures for each target it routes to on
`hf.serving.<target>.metrics` (core NATS, every `HETEROFLOW_SERVE_METRICS_INTERVAL_S`); a
`RouterFigures` book (libs/domain/router_figures.py) keeps the latest of each and forgets
what is older than `HETEROFLOW_AUTOSCALE_METRIC_MAX_AGE_S`. Every AutoScaler instance
listens (cheap), only the leader reads.
"""

from __future__ import annotations

from libs.bus.broker import Routes
from libs.bus.subjects import SERVING_PREFIX
from libs.domain.router_figures import RouterFigures
from libs.domain.serving import ServingMetrics


def routes(book: RouterFigures | None = None) -> Routes:
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
