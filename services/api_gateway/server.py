"""Serving the api-gateway: in this process, or as worker processes sharing one port.

The gateway keeps no state between requests (the store holds it all, and each worker's
credential cache only saves lookups), so `HETEROFLOW_GATEWAY_WORKERS=N` runs N processes
that accept on one listening socket: a second core serves requests instead of waiting for
the first. With N = 1 (the default) the gateway runs in the calling process as before: in
`heteroflow up` on the platform's event loop, next to the other services.

HTTP is parsed by httptools (uvicorn's C parser) instead of h11, in uvicorn's httptools
protocol with deadlines on a request's headers and body and a cap on open connections
(connections.py); a worker process, and `heteroflow service api-gateway`, also run on uvloop.

Workers are spawned (not forked: the parent holds connections and threads), each with its
own connection pool and NATS connection. The parent restarts a worker that dies, stops them
with SIGTERM (SIGKILL after a grace period), and a worker whose parent is gone stops by
itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import socket
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from multiprocessing.context import SpawnProcess
from multiprocessing.synchronize import Event as ProcessEvent

import structlog
import uvicorn
from nats.aio.client import Client

from libs import collector
from libs.bus.nats import connect
from libs.config import GatewaySettings
from libs.logging import configure
from libs.store.eventstore import EventStore
from services.api_gateway.app import create_app
from services.api_gateway.connections import (
    ACCEPT_BATCH,
    GatewayConfig,
    SlowClientLimits,
    connection_cap,
    install_accept_errors,
    relisten,
)
from services.api_gateway.dataplane import ServeDataPlane

log = structlog.get_logger(__name__)

STOP_GRACE_S = 10.0
RESTART_DELAY_S = 1.0
POLL_S = 0.25


class Server(uvicorn.Server):
    """uvicorn without its own signal handling: the process owns shutdown order."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if getattr(self, "servers", None):
            relisten(self.servers)


def server_config(app: object, settings: GatewaySettings) -> uvicorn.Config:
    limits = SlowClientLimits(
        header_timeout_s=settings.client_header_timeout_s,
        body_timeout_s=settings.client_body_timeout_s,
        max_connections=connection_cap(settings.max_client_connections),
    )
    dataplane = ServeDataPlane(app) if settings.serve_dataplane else None
    return GatewayConfig(
        app,
        limits=limits,
        dataplane=dataplane,
        host=settings.host,
        port=settings.port,
        backlog=ACCEPT_BATCH,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
    )


def fast_loop() -> asyncio.AbstractEventLoop:
    """An event loop for a process that serves HTTP only: uvloop where it is installed."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a dependency; the standard loop still works
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def freeze_startup_heap() -> None:
    """Put what start-up allocated out of the cyclic collector's reach (`gc.freeze`).

    A full collection walks every tracked object with the event loop stopped: in a gateway
    worker that is ~140,000 objects of modules, the app, its routes and models, ~60 ms a
    time, every request waiting behind it. Frozen, they are never walked again (they live as
    long as the process anyway); what requests allocate is still collected as before."""
    collector.freeze()


async def serve_here(
    settings: GatewaySettings,
    store: EventStore,
    nc: Client,
    stop: asyncio.Event,
    *,
    sock: socket.socket | None = None,
    started: Callable[[], None] = lambda: None,
    freeze_heap: bool = True,
) -> None:
    """One gateway server in this process until `stop`; `started` once it accepts (its
    start-up heap frozen first, unless `freeze_heap` is false: a test's process)."""
    install_accept_errors(asyncio.get_running_loop())
    server = Server(server_config(create_app(settings, store, nc), settings))
    task = asyncio.create_task(server.serve(sockets=[sock] if sock else None))
    while not server.started and not task.done():  # uvicorn flags its start, no event
        await asyncio.wait([task], timeout=0.05)
    if server.started:
        if freeze_heap:
            freeze_startup_heap()
        started()
    await asyncio.wait(
        [task, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED
    )
    server.should_exit = True
    await task


# --- worker processes ----------------------------------------------------------------------


@dataclass
class Workers:
    """N gateway processes on one listening socket, kept running until `run` is stopped."""

    settings: GatewaySettings
    database_url: str
    nats_url: str
    _sock: socket.socket | None = None
    _procs: list[tuple[SpawnProcess, ProcessEvent]] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return bool(self._procs) and all(p.is_alive() and ev.is_set() for p, ev in self._procs)

    async def run(self, stop: asyncio.Event) -> None:
        self._sock = listen(self.settings.host, self.settings.port)
        try:
            self._procs = [self._start(i) for i in range(self.settings.gateway_workers)]
            while not stop.is_set():
                for i, (proc, _) in enumerate(self._procs):
                    if not proc.is_alive():
                        log.warning("gateway_worker_exited", worker=i, rc=proc.exitcode)
                        await asyncio.sleep(RESTART_DELAY_S)
                        self._procs[i] = self._start(i)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), POLL_S)
        finally:
            await asyncio.gather(*(asyncio.to_thread(_terminate, p) for p, _ in self._procs))
            self._sock.close()

    def _start(self, index: int) -> tuple[SpawnProcess, ProcessEvent]:
        ctx = multiprocessing.get_context("spawn")
        ready = ctx.Event()
        assert self._sock is not None
        proc = ctx.Process(
            target=worker_main,
            args=(index, self.settings, self.database_url, self.nats_url, self._sock, ready),
            kwargs={"parent": os.getpid()},
            name=f"api-gateway-{index}",
            daemon=True,
        )
        proc.start()
        log.info("gateway_worker_started", worker=index, pid=proc.pid)
        return proc, ready


def listen(host: str, port: int) -> socket.socket:
    """The listening socket the workers share (bound as uvicorn binds its own)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _terminate(proc: SpawnProcess) -> None:
    if proc.is_alive():
        proc.terminate()
        proc.join(STOP_GRACE_S)
    if proc.is_alive():
        log.warning("gateway_worker_killed", pid=proc.pid, after_s=STOP_GRACE_S)
        proc.kill()
        proc.join()


def worker_main(
    index: int,
    settings: GatewaySettings,
    database_url: str,
    nats_url: str,
    sock: socket.socket,
    ready: ProcessEvent,
    *,
    parent: int,
) -> None:
    """Entry point of a worker process: serve on `sock` until SIGTERM/SIGINT."""
    configure(settings.log_level, settings.log_format)
    collector.tune(settings.gc_threshold)
    structlog.contextvars.bind_contextvars(process=f"api-gateway-{index}")
    with asyncio.Runner(loop_factory=fast_loop) as runner:
        runner.run(_worker(settings, database_url, nats_url, sock, ready, parent))


async def _worker(
    settings: GatewaySettings,
    database_url: str,
    nats_url: str,
    sock: socket.socket,
    ready: ProcessEvent,
    parent: int,
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    orphan_guard = asyncio.create_task(_watch_parent(parent, stop))
    store = await EventStore.open(database_url, max_size=settings.db_pool_max)
    nc = await connect(nats_url, "api-gateway")
    try:
        await serve_here(settings, store, nc, stop, sock=sock, started=ready.set)
    finally:
        orphan_guard.cancel()
        await nc.drain()
        await store.close()


async def _watch_parent(parent: int, stop: asyncio.Event) -> None:
    """A worker whose parent died (even by SIGKILL) is re-parented: then it stops."""
    while not stop.is_set():
        if os.getppid() != parent:
            log.warning("gateway_parent_gone_stopping", parent=parent)
            stop.set()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
