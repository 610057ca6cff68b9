"""The job orchestrator: the dependency cascade of jobs (SPEC §7, seed 004)."""

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
        name="job-orchestrator",
        Settings=service.OrchestratorSettings,
        run=service.run,
        routes=documented(service.routes),
        nats_user=perms.NatsUser("job-orchestrator"),
    )
    globals()["SERVICE"] = spec
    return spec
