"""The event timeline: what happened to a task, group or node, as entries written from the
domain events and the nodes' telemetry."""

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
        name="event-timeline",
        Settings=service.TimelineSettings,
        run=service.run,
        routes=documented(service.routes),
        nats_user=perms.NatsUser("event-timeline"),
    )
    globals()["SERVICE"] = spec
    return spec
