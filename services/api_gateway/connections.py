"""Slow clients cost only themselves: deadlines on reading a request, a cap on connections.

uvicorn bounds only the silence after a response (`timeout_keep_alive`). A client that
trickles its headers or its body, a byte every few seconds, holds its connection, its file
descriptor and, once its headers are in, a running handler for as long as it likes; enough
of them take every descriptor of the process, and then `accept()` fails for everyone.

`SlowClientProtocol` is uvicorn's httptools protocol with, per connection:

* a header deadline: from the connection's start (or a keep-alive request's first byte) to
  the end of its headers, `client_header_timeout_s`;
* a body deadline: from the end of the headers to the end of the body,
  `client_body_timeout_s` (time in which the server itself stopped reading, a handler not
  taking the body yet, is not the client's: the deadline waits for it);
* past either, `408` in the error shape of SPEC §2 and the connection closed.

The deadlines are timers on the connection, not an ASGI middleware around `receive()`: a
middleware only acts when a handler reads, cannot see headers at all, and depends on every
handler (the router's too) answering the exception it raises. A closed transport is seen by
every handler the same way (uvicorn hands it `http.disconnect`), so its work and whatever
slot it holds end with it.

And per gateway process, at most `max_client_connections` open connections: a new one past
the cap closes the connection idle the longest (between requests or still sending its
headers), or itself when none is idle. The cap sits below the open-files limit, so idle
sockets cannot starve `accept()`.

`AcceptErrors` is the event loop's exception handler for what is left: asyncio logs each
failed `accept()` (`socket.accept() out of system resource`), up to the backlog's length
per wake-up; it logs one line per interval with the count, and passes everything else on.
"""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

import orjson
import structlog
import uvicorn
from prometheus_client import Counter
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from libs.domain.errors import Code

from .dataplane.proxy import ClientWatch
from .dataplane.wire import SERVE_METHODS, target_of

log = structlog.get_logger(__name__)

CLOSED = Counter(
    "heteroflow_gateway_connections_closed_total",
    "Client connections the gateway closed: header or body deadline passed (408), or the "
    "connection cap reached (the longest idle one, or the new one when none is idle)",
    ["reason"],
)
ACCEPT_ERRORS = Counter(
    "heteroflow_gateway_accept_errors_total",
    "accept() calls on the gateway's socket that failed for want of a resource (descriptors)",
)

# Left to the rest of the process (database pools, NATS, files, the router's upstreams)
# when the connection cap is derived from the open-files limit: a quarter, at least this.
RESERVED_FDS = 128
# asyncio accepts up to `backlog` connections per wake-up of the listening socket, before any
# of them reaches its protocol (where the cap acts), and closes an evicted one a loop turn
# later: the cap leaves room for a few such batches. The kernel's queue is set apart from it
# (`relisten`), so a burst of connects still waits there instead of being refused.
ACCEPT_BATCH = 64
ACCEPTS_IN_FLIGHT = 4 * ACCEPT_BATCH
KERNEL_BACKLOG = 2048
# While the server itself does not read (a handler not taking the body yet), a passed body
# deadline is looked at again this much later.
PAUSED_RECHECK_S = 1.0
ACCEPT_LOG_EVERY_S = 10.0
ACCEPT_FAILED = "socket.accept() out of system resource"


def connection_cap(configured: int) -> int:
    """`configured`, or with 0 the open-files soft limit less what the process needs and
    room for the accepts in flight."""
    if configured > 0:
        return configured
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1_000_000
    return max(16, soft - max(RESERVED_FDS, soft // 4) - ACCEPTS_IN_FLIGHT)


def relisten(servers: list[asyncio.Server]) -> None:
    """Give the listening sockets the kernel queue KERNEL_BACKLOG (asyncio set it to the
    accept batch, uvicorn's `backlog`)."""
    for server in servers:
        for sock in server.sockets:
            with socket.socket(fileno=os.dup(sock.fileno())) as dup:
                dup.listen(KERNEL_BACKLOG)


@dataclass(frozen=True)
class SlowClientLimits:
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int  # resolved: `connection_cap(settings.max_client_connections)`


class GatewayConfig(uvicorn.Config):
    """uvicorn's config with the limits the protocol reads (uvicorn passes it the config)."""

    def __init__(
        self, app: Any, *, limits: SlowClientLimits, dataplane: Any = None, **kwargs: Any
    ) -> None:
        super().__init__(app, http=SlowClientProtocol, **kwargs)
        self.slow_clients = limits
        # The /serve/ handler (dataplane/), run instead of the application; None: the app.
        self.dataplane = dataplane


def _answer_408(what: str, timeout_s: float) -> bytes:
    body = orjson.dumps(
        {
            "error": f"the request's {what} did not arrive within {timeout_s:g} s",
            "code": int(Code.REQUEST_TIMEOUT),
            "fields": [what],
        }
    )
    return (
        b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body
    )


class SlowClientProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with header and body deadlines and the connection cap."""

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        limits = getattr(config, "slow_clients", None)
        self.limits: SlowClientLimits = limits or SlowClientLimits(10.0, 30.0, 0)
        self.idle_since = time.monotonic()
        self._deadline: asyncio.TimerHandle | None = None
        self._reading: str | None = None  # "headers" or "body" while a deadline runs
        self._began = False  # a byte of the request being read has come
        self.dataplane = getattr(config, "dataplane", None)
        self._watch: ClientWatch | None = None  # the /serve/ request being proxied

    # --- the connection cap ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm("headers", self.limits.header_timeout_s)
        if 0 < self.limits.max_connections < len(self.connections):
            idle = [c for c in self.connections if _idle(c) and c is not self]
            victim = min(idle, key=lambda c: c.idle_since, default=self)
            CLOSED.labels("cap_idle" if victim is not self else "cap_new").inc()
            victim.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
        if self._watch is not None:
            self._watch.lost()
            self._watch = None

    # --- the serving data path --------------------------------------------------------------

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        """A `/serve/{target}/...` request goes to the data path (dataplane/), not the app."""
        scope = cycle.scope
        if (
            self.dataplane is None
            or app is not self.app
            or scope["method"] not in SERVE_METHODS
            or target_of(scope["path"]) is None
        ):
            super()._start_asgi_task(cycle, app)  # the application (and its 405, 404)
            return
        watch = ClientWatch()

        def close_client() -> None:  # an answer broken mid-way: the client sees it end short
            cycle.disconnected = True
            self.transport.close()

        watch.close_client = close_client
        cycle.scope["extensions"] = {"heteroflow.client": watch}  # type: ignore[dict-item]
        self._watch = watch
        super()._start_asgi_task(cycle, self.dataplane)

    # --- the deadlines --------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._reading is None:  # a keep-alive request's first byte
            self._arm("headers", self.limits.header_timeout_s)
        self._began = True

    def on_headers_complete(self) -> None:
        self._disarm()
        pipelined = self.cycle is not None and not self.cycle.response_complete
        super().on_headers_complete()
        upgrading = self.parser.should_upgrade() and self._should_upgrade()
        # A queued request's reading waits for the one before it; an upgraded connection
        # (a WebSocket) is another protocol's from here.
        if not pipelined and not upgrading:
            self._arm("body", self.limits.body_timeout_s)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self.idle_since = time.monotonic()
        self._watch = None
        self._began = False
        super().on_response_complete()

    def _arm(self, what: str, timeout_s: float) -> None:
        self._disarm()
        if timeout_s > 0:
            self._reading = what
            self._deadline = self.loop.call_later(timeout_s, self._expired, what, timeout_s)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = None
        self._reading = None

    def _expired(self, what: str, timeout_s: float) -> None:
        self._deadline = None
        if self.transport is None or self.transport.is_closing():
            return
        if what == "body" and self.flow is not None and self.flow.read_paused:
            # The server is not reading (the handler has not taken what came): not the
            # client's time.
            self._deadline = self.loop.call_later(PAUSED_RECHECK_S, self._expired, what, timeout_s)
            return
        self._reading = None
        CLOSED.labels(f"{what}_timeout").inc()
        if what == "headers":
            answer = self._began  # a connection that never sent a byte is only closed
        else:
            answer = self.cycle is not None and not self.cycle.response_started
        if answer:
            self.transport.write(_answer_408(what, timeout_s))
        # The handler, if one runs, is handed `http.disconnect` and ends.
        self.transport.close()


def _idle(conn: object) -> TypeGuard[SlowClientProtocol]:
    """A connection with no request being read or answered."""
    if not isinstance(conn, SlowClientProtocol) or conn.transport.is_closing():
        return False  # (one closing already is on its way out: not a second time)
    cycle = conn.cycle
    return (cycle is None or cycle.response_complete) and conn._reading != "body"


class AcceptErrors:
    """An event loop exception handler that logs failed accepts once per interval."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        every_s: float = ACCEPT_LOG_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.previous = loop.get_exception_handler()
        self.every_s = every_s
        self.clock = clock
        self.suppressed = 0
        self.logged_at = -every_s

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != ACCEPT_FAILED:
            if self.previous is not None:
                self.previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        ACCEPT_ERRORS.inc()
        now = self.clock()
        if now - self.logged_at < self.every_s:
            self.suppressed += 1
            return
        log.warning(
            "gateway_accept_failed",
            error=str(context.get("exception")),
            since_last=self.suppressed,
            next_within_s=self.every_s,
        )
        self.suppressed = 0
        self.logged_at = now


def install_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Rate-limit the accept-failure log on `loop` (once: the handler chains the previous)."""
    if not isinstance(loop.get_exception_handler(), AcceptErrors):
        loop.set_exception_handler(AcceptErrors(loop))
