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
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
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

POLL_S = 0.25
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
HEALTHY_AFTER_S = 60.0


class Server(Protocol):
    @property
    def pid(self) -> int | None: ...

    def exit_code(self) -> int | None: ...

    def restart(self) -> None: ...


@dataclass
class ServerSupervisor:
    """Watch `servers` (name → server) until `stop`, starting again any that dies."""

    servers: dict[str, Server]
    poll_s: float = POLL_S
    first_backoff_s: float = FIRST_BACKOFF_S
    max_backoff_s: float = MAX_BACKOFF_S
    healthy_after_s: float = HEALTHY_AFTER_S

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.gather(*(self._watch(name, s, stop) for name, s in self.servers.items()))

    async def _watch(self, name: str, server: Server, stop: asyncio.Event) -> None:
        backoff = self.first_backoff_s
        since = time.monotonic()
        while not stop.is_set():
            code = server.exit_code()
            if code is None:
                RUNNING.labels(name).set(1)
                if time.monotonic() - since >= self.healthy_after_s:
                    backoff = self.first_backoff_s
                await _sleep(stop, self.poll_s)
                continue
            RUNNING.labels(name).set(0)
            log.error("embedded_server_died", server=name, exit_code=code, restart_in_s=backoff)
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
            log.warning("embedded_server_restarted", server=name, pid=server.pid, after_s=wait)


async def _sleep(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep unless `stop` is set first; True when it was."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()
