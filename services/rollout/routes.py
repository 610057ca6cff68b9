"""Every subscription of the rollout process: the routers' figures per serving target.

The routers publish their figures for every serving target on `hf.serving.<target>.metrics`
(core NATS, every `HETEROFLOW_SERVE_METRICS_INTERVAL_S`), with the in-flight requests of each
replica and the replicas they know are draining; the book handed in keeps them.
"""

from __future__ import annotations

from libs.bus.broker import Routes
from libs.bus.subjects import SERVING_PREFIX
from libs.domain.group.router_figures import RouterFigures
from libs.domain.group.serving import ServingMetrics


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
