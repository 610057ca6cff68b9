"""The retry engine: decides what happens to a failed task (retry here, on another node,
or give up), from the class of the failure and the facts of its node (service.py)."""

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
        name="retry-engine",
        Settings=service.RetrySettings,
        run=service.run,
        routes=documented(service.routes),
        nats_user=perms.NatsUser("retry-engine"),
    )
    globals()["SERVICE"] = spec
    return spec
