"""Every subscription of the autoscaler process: the routers' figures per serving target.

Every gateway process publishes its own figures for each target it routes to on
`hf.serving.<target>.metrics` (core NATS, every `HETEROFLOW_SERVE_METRICS_INTERVAL_S`, and
at once on a request after a quiet second); a `RouterFigures` book
(libs/domain/group/router_figures.py) keeps the latest of each and forgets what is older than
`HETEROFLOW_AUTOSCALE_METRIC_MAX_AGE_S`. Every instance listens (cheap); only the leaders
read: the AutoScaler (requests/s, concurrency, latency, queue) and the idle-sleep controller
(idle seconds, requests in flight or queued).
"""

from __future__ import annotations

from libs.bus.broker import Routes
from libs.bus.subjects import SERVING_PREFIX
from libs.domain.group.router_figures import RouterFigures
from libs.domain.group.serving import ServingMetrics


def routes(book: RouterFigures | None = None) -> Routes:
    async def ignore(_: ServingMetrics) -> None:
        return None

    r = Routes("autoscaler")
    r.core(
        ServingMetrics,
        book.hear if book is not None else ignore,
        subject=f"{SERVING_PREFIX}.*.metrics",
        description="The router's figures per serving target and gateway process: the "
        "AutoScaler's qps, concurrency, latency_p95_ms and queue_depth, and the idle seconds "
        "and held requests idle sleep is judged on (docs/autoscaling.md, docs/serving.md).",
    )
    return r
