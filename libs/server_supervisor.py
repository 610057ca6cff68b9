"""Keeps the embedded servers of `heteroflow up` running while it runs.

Each server is a child process of `up` (libs/embedded.py). One watcher per server polls it;
when it has died, the watcher logs `embedded_server_died` (error level, with the exit status),
waits a backoff (1 s, doubling to 30 s while the server keeps dying, back to 1 s once it has
lived a minute), starts it again on the same port or socket and data, counts
`heteroflow_embedded_server_restarts_total{server}` and logs `embedded_server_restarted`.
Clients keep their URLs: NATS clients reconnect by themselves, the database pool opens new
connections, and meanwhile `/readyz` names the missing dependency and the gateway answers 503.

A start that fails (a killed postmaster's backends still hold its shared memory, a port not
yet free) is logged and tried again after the next, longer backoff.

A server can be alive and still broken: nats-server whose JetStream store met a write error
(a full disk) refuses every write until it restarts. A `HealthCheck` names such a failure;
one that lasts `unhealthy_after_s` (past `health_grace_s` after a start, while clients
reconnect) is logged as `embedded_server_unhealthy` with its cause, counted in
`heteroflow_embedded_server_unhealthy_total{server}`, and the server is ended and started
again like one that died. The check itself decides when a restart can help (heteroflow/
platform.py: not while the disk is still full).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import structlog
from prometheus_client import Counter, Gauge

log = structlog.get_logger(__name__)

RESTARTS = Counter(
    "heteroflow_embedded_server_restarts_total",
    "Embedded servers started again by `up` after they died",
    ["server"],
)
RUNNING = Gauge(
    "heteroflow_embedded_server_up",
    "1 while the embedded server runs, 0 while it is down",
    ["server"],
)

UNHEALTHY = Counter(
    "heteroflow_embedded_server_unhealthy_total",
    "Embedded servers ended and started again by `up` because their health check failed",
    ["server"],
)

POLL_S = 0.25
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
HEALTHY_AFTER_S = 60.0
UNHEALTHY_AFTER_S = 5.0
HEALTH_GRACE_S = 10.0


class Server(Protocol):
    @property
    def pid(self) -> int | None: ...

    def exit_code(self) -> int | None: ...

    def restart(self) -> None: ...


@dataclass(frozen=True)
class HealthCheck:
    """A running server's health beyond being alive."""

    cause: Callable[[], str | None]
    """Why the server is broken, in words; None while it is healthy (or a restart would not
    help)."""
    end: Callable[[], None]
    """Ends the server (its exit status is kept), so that it is started again."""


@dataclass
class ServerSupervisor:
    """Watch `servers` (name → server) until `stop`, starting again any that dies, or that
    its `health` check finds broken."""

    servers: dict[str, Server]
    poll_s: float = POLL_S
    first_backoff_s: float = FIRST_BACKOFF_S
    max_backoff_s: float = MAX_BACKOFF_S
    healthy_after_s: float = HEALTHY_AFTER_S
    health: dict[str, HealthCheck] = field(default_factory=dict)
    unhealthy_after_s: float = UNHEALTHY_AFTER_S
    health_grace_s: float = HEALTH_GRACE_S

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.gather(*(self._watch(name, s, stop) for name, s in self.servers.items()))

    async def _watch(self, name: str, server: Server, stop: asyncio.Event) -> None:
        backoff = self.first_backoff_s
        since = time.monotonic()
        check = self.health.get(name)
        broken_since: float | None = None
        ended_for: str | None = None
        while not stop.is_set():
            code = server.exit_code()
            if code is None:
                RUNNING.labels(name).set(1)
                now = time.monotonic()
                if now - since >= self.healthy_after_s:
                    backoff = self.first_backoff_s
                cause = check.cause() if check and now - since >= self.health_grace_s else None
                if cause is None:
                    broken_since = None
                elif broken_since is None:
                    broken_since = now
                elif now - broken_since >= self.unhealthy_after_s:
                    assert check is not None
                    log.error(
                        "embedded_server_unhealthy",
                        server=name,
                        cause=cause,
                        for_s=round(now - broken_since, 1),
                    )
                    UNHEALTHY.labels(name).inc()
                    await asyncio.to_thread(check.end)
                    broken_since, ended_for = None, cause
                    continue
                await _sleep(stop, self.poll_s)
                continue
            RUNNING.labels(name).set(0)
            if ended_for is None:
                log.error("embedded_server_died", server=name, exit_code=code, restart_in_s=backoff)
            else:
                log.warning(
                    "embedded_server_ended", server=name, cause=ended_for, restart_in_s=backoff
                )
                ended_for = None
            if await _sleep(stop, backoff):
                return
            wait, backoff = backoff, min(backoff * 2, self.max_backoff_s)
            try:
                await asyncio.to_thread(server.restart)
            except Exception as exc:  # noqa: BLE001 - any failed start is retried
                log.error("embedded_server_restart_failed", server=name, error=str(exc)[-500:])
                continue
            RESTARTS.labels(name).inc()
            since = time.monotonic()
            broken_since = None
            log.warning("embedded_server_restarted", server=name, pid=server.pid, after_s=wait)


async def _sleep(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep unless `stop` is set first; True when it was."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()
