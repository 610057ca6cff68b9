"""Keep-alive connections to replicas: raw asyncio protocols, responses parsed by httptools.

An `Upstream` carries one exchange (a request, then its response) at a time. The response
is handed to the one coroutine proxying it as it arrives: the head once parsed, then the
body in the pieces the socket gave (nothing is gathered up, so Server-Sent Events pass
through as they come). Backpressure both ways is the transport's: the request body waits
for `drain()` while the replica's socket is full, and the replica's socket stops being read
while more than `READ_HIGH_WATER` bytes of its answer wait for a slow client.

An exchange that ended cleanly on a connection the replica keeps alive puts it back in the
`UpstreamPool` (per address, per gateway worker, no lock: one event loop); anything else
(a client that left, an error, a HEAD answer, `Connection: close`) closes it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import cast

import httptools

CONNECT_TIMEOUT_S = 5.0
IDLE_PER_ADDRESS = 256
# Response bytes held for a slow client before the replica's socket stops being read.
READ_HIGH_WATER = 256 * 1024


class UpstreamError(Exception):
    """The exchange with a replica failed. `name` says how, in the words the router has
    always used: ConnectError (not delivered), RemoteProtocolError (closed or not HTTP
    before the answer), ReadError (broken during the answer)."""

    def __init__(self, name: str, detail: str = "") -> None:
        super().__init__(detail or name)
        self.name = name


class UpstreamTimeout(UpstreamError):
    """No answer began within the first-byte deadline."""

    def __init__(self) -> None:
        super().__init__("ReadTimeout")


class Upstream(asyncio.Protocol):
    """One connection to a replica."""

    def __init__(self, pool: UpstreamPool, address: str) -> None:
        self.pool = pool
        self.address = address
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle = False
        self.exchanges = 0  # begun on this connection, the current one included
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self._write_paused = False
        self._read_paused = False
        self._deadline: asyncio.TimerHandle | None = None
        self._idle_s = 0.0  # the longest silence allowed during an answer (0: none)
        self._last_data = 0.0
        self._reset(head_only=False)

    def _reset(self, head_only: bool) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.complete = False
        self.error: UpstreamError | None = None
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.framed = False  # the answer has a Content-Length or is chunked
        self.head_only = head_only
        self.got_bytes = False
        self.keep_alive = False
        self._informational = False

    # --- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport instances, only alike)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.idle or self.complete:
            # Nothing was asked: a replica that talks out of turn is not reused.
            self._close()
            return
        self.got_bytes = True
        self._last_data = self._loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError("RemoteProtocolError", f"not HTTP: {exc}"))
            self._close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.idle:
            self.pool.discard(self)
            return
        if not self.complete and self.error is None:
            if self.head_done and not self.framed:
                self.complete = True  # an answer delimited by the end of the connection
            elif self.head_done:
                self._fail(UpstreamError("ReadError", "the replica closed during its answer"))
            else:
                self._fail(UpstreamError("RemoteProtocolError", "closed without an answer"))
        self._wake()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # --- httptools callbacks ---------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))
        lower = name.lower()
        if lower == b"content-length" or lower == b"transfer-encoding":
            self.framed = True

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # 100 Continue and the like: the answer is still to come
            self._informational = True
            self.headers = []
            self.framed = False
            return
        self.status = status
        self.head_done = True
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self.head_only or status in (204, 304):
            self.framed = True
            if self.head_only:
                # The parser would wait for the body a HEAD answer announces: it has none.
                self.complete = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > READ_HIGH_WATER and not self._read_paused and self.transport:
            self._read_paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        self.complete = True
        # Read here: once the callback returns the parser is reset for the next message.
        self.keep_alive = self.parser.should_keep_alive()
        self._wake()

    # --- the exchange, for the coroutine proxying it ---------------------------------------

    def begin(self, head: bytes, head_only: bool) -> None:
        """Send a request's head; its body (if any) follows with `write`."""
        self._reset(head_only)
        self.exchanges += 1
        assert self.transport is not None
        self.transport.write(head)

    async def write(self, data: bytes) -> None:
        if self.closed or self.transport is None:
            raise self.error or UpstreamError("RemoteProtocolError", "closed while sent a body")
        self.transport.write(data)
        if self._write_paused:
            self._drain = self._loop.create_future()
            await self._drain
            self._drain = None
            if self.closed and not self.head_done:
                raise self.error or UpstreamError("RemoteProtocolError", "closed while sent a body")

    def first_byte_within(self, seconds: float) -> None:
        """Fail the exchange with `UpstreamTimeout` if no answer has begun `seconds` from now."""
        if not self.head_done:
            self._deadline = self._loop.call_later(seconds, self._timed_out)

    def silence_within(self, seconds: float) -> None:
        """Once the answer has begun, fail it if the replica sends nothing for `seconds`
        (while the client is slow and the replica not read, the wait is not its own)."""
        self._idle_s = seconds
        self._last_data = self._loop.time()
        if self.head_done and not self.complete:
            self._deadline = self._loop.call_later(seconds, self._silent)

    def _silent(self) -> None:
        self._deadline = None
        if self.complete or self.error is not None or self.closed:
            return
        left = self._last_data + self._idle_s - self._loop.time()
        if left > 0 or self._read_paused:
            self._deadline = self._loop.call_later(max(left, 1.0), self._silent)
            return
        self._fail(UpstreamError("ReadTimeout", f"nothing from the replica for {self._idle_s:g}s"))
        self._close()

    def _timed_out(self) -> None:
        self._deadline = None
        if not self.head_done and self.error is None:
            self._fail(UpstreamTimeout())
            self._close()

    async def head(self) -> int:
        """The answer's status, once its head is in (`headers` then holds its headers)."""
        while not self.head_done:
            if self.error is not None:
                raise self.error
            await self._wait()
        return self.status

    async def read(self) -> bytes | None:
        """What has come of the body since the last read, None at its end."""
        while not self.chunks:
            if self.complete:
                return None
            if self.error is not None:
                raise self.error
            await self._wait()
        data = self.chunks.popleft() if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        if self._read_paused and self.transport is not None and not self.closed:
            self._read_paused = False
            self.transport.resume_reading()
        return data

    @property
    def at_end(self) -> bool:
        """The body has come whole and been read."""
        return self.complete and not self.chunks

    def release(self) -> None:
        """The exchange is over: back to the pool when it ended cleanly on a connection the
        replica keeps alive, closed otherwise."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        reusable = (
            self.complete
            and self.error is None
            and not self.head_only
            and not self.closed
            and not self.chunks
            and self.keep_alive
        )
        if reusable:
            self.pool.put(self)
        else:
            self._close()

    def abort(self) -> None:
        """Drop the connection now (the client left, or the exchange cannot go on)."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, error: UpstreamError) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    async def _wait(self) -> None:
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class UpstreamPool:
    """Idle keep-alive connections per replica address, for one event loop."""

    def __init__(
        self, idle_max: int = IDLE_PER_ADDRESS, connect_timeout_s: float = CONNECT_TIMEOUT_S
    ) -> None:
        self.idle_max = idle_max
        self.connect_timeout_s = connect_timeout_s
        self._idle: dict[str, list[Upstream]] = {}
        self.opened = 0  # connections opened since start (reuse shows as few)

    async def get(self, address: str, fresh: bool = False) -> Upstream:
        """An idle connection to `address`, or a new one (always new with `fresh`)."""
        idle = self._idle.get(address)
        while idle and not fresh:
            conn = idle.pop()
            if not conn.closed:
                conn.idle = False
                return conn
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: Upstream(self, address), host, int(port)
                )
        except (OSError, TimeoutError, ValueError) as exc:
            raise UpstreamError("ConnectError", str(exc) or type(exc).__name__) from None
        self.opened += 1
        return conn

    def put(self, conn: Upstream) -> None:
        idle = self._idle.setdefault(conn.address, [])
        if len(idle) >= self.idle_max:
            conn._close()
            return
        conn.idle = True
        idle.append(conn)

    def discard(self, conn: Upstream) -> None:
        idle = self._idle.get(conn.address)
        if idle and conn in idle:
            idle.remove(conn)

    def idle_count(self, address: str) -> int:
        return len(self._idle.get(address, ()))

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn._close()
        self._idle.clear()
