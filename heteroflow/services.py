"""The services of the platform: the one list.

`heteroflow up` runs them (in its process, or each as a child with `--processes`),
`heteroflow service NAME` runs one, readiness waits on the durable consumers their routes
declare, the embedded NATS server gets one user per service, and the AsyncAPI document is
generated from their routes: all of it from `SERVICES`. Adding a service is a package
`services/<name>/` whose `__init__.py` exports `SERVICE = ServiceSpec(...)`
(libs/service.py), and one line here.

The order is the start order of `up --processes`: the relay first (every consumer waits on
the events it publishes), the api-gateway last (it takes requests once the rest is up).

Not services: the local agent (a node's process, `heteroflow agent`, which `up` adds unless
HETEROFLOW_LOCAL_AGENT=false) and the node-login sync (a loop of `up` itself over the
embedded NATS server it owns, heteroflow/platform.py).
"""

from __future__ import annotations

from libs.bus.permissions import NatsUser
from libs.service import ServiceSpec
from services import (
    api_gateway,
    autoscaler,
    event_timeline,
    job_orchestrator,
    relay,
    retry_engine,
    rollout,
    scheduler,
)

SERVICES: tuple[ServiceSpec, ...] = (
    relay.SERVICE,
    scheduler.SERVICE,
    retry_engine.SERVICE,
    job_orchestrator.SERVICE,
    event_timeline.SERVICE,
    autoscaler.SERVICE,
    rollout.SERVICE,
    api_gateway.SERVICE,
)


def names() -> tuple[str, ...]:
    return tuple(spec.name for spec in SERVICES)


def by_name(name: str) -> ServiceSpec:
    for spec in SERVICES:
        if spec.name == name:
            return spec
    raise KeyError(f"no service {name!r}; the services are {', '.join(names())}")


def nats_users() -> tuple[NatsUser, ...]:
    """The NATS users of the services, one per service."""
    return tuple(spec.nats_user for spec in SERVICES)


def lease_ttl_s() -> float:
    """The TTL of the lease bucket: one for every leader-only controller (the TTL belongs to
    the bucket, libs/bus/lease.py), so the services that lead must agree on it."""
    ttls = {spec.lease_ttl_s for spec in SERVICES if spec.lease_ttl_s is not None}
    if len(ttls) != 1:
        raise ValueError(f"the leading services must share one lease TTL, not {sorted(ttls)}")
    return ttls.pop()
