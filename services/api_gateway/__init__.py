"""The api-gateway: the HTTP API (app.py and the routes_* modules), the serving router
(serving.py) and its server, in-process or as worker processes (server.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from libs.service import ServiceSpec

    SERVICE: ServiceSpec


def __getattr__(name: str) -> Any:
    """`SERVICE`, built on first use: importing a module of the package (a pure one) does not
    import the service's I/O modules."""
    if name != "SERVICE":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from libs.bus import permissions as perms
    from libs.service import ServiceSpec, documented

    from . import service

    spec = ServiceSpec(
        name="api-gateway",
        Settings=service.GatewaySettings,
        run=service.run,
        routes=documented(service.routes),
        nats_user=perms.NatsUser("api-gateway", may_publish=(perms.SERVING_METRICS,)),
        pool_max=service.pool_max,
        loop=service.fast_loop,
    )
    globals()["SERVICE"] = spec
    return spec
