"""The autoscaler service: three leader-only controllers (controllers/: the AutoScaler,
the schedule windows and idle sleep), fed by the routers' figures it subscribes to
(routes.py); service.py runs them."""

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
        name="autoscaler",
        Settings=service.AutoscalerSettings,
        run=service.run,
        routes=documented(service.routes),
        nats_user=perms.NatsUser("autoscaler"),
        lease_ttl_s=service.LEASE_TTL_S,
    )
    globals()["SERVICE"] = spec
    return spec
