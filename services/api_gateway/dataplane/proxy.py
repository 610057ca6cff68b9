"""The `/serve/` handler the gateway's HTTP protocol runs instead of the API application.

The routing decisions are the router's own (`ServingRouter.target`, `acquire`: tenant
scope, readiness, least outstanding, draining, the bounded wait and the wake); only the
bytes take another way: no FastAPI routing or middleware, no httpx, one coroutine per
request between the client's connection (uvicorn's httptools cycle) and a pooled
keep-alive connection to the replica (upstream.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog

from libs import auth
from libs.domain.errors import Code, DomainError, StoreUnavailable, Throttled

from .. import metrics as http_metrics
from ..errors import INTERNAL_ERROR, STORE_RETRY_AFTER_S
from ..limits import BodyTooLarge
from ..routes_serve import IDEMPOTENT, PICKS, REPLAY_MAX_BYTES
from ..serving import SERVE_REQUESTS, ServeUnavailable, ServingRouter, Target
from . import wire
from .upstream import Upstream, UpstreamError, UpstreamPool, UpstreamTimeout

log = structlog.get_logger(__name__)

ROUTE = "/serve/{target_id}/{path:path}"


class ClientWatch:
    """Between the client's connection and its request's coroutine: a connection lost
    cancels the coroutine (and with it the upstream exchange)."""

    __slots__ = ("task", "gone", "close_client")

    def __init__(self) -> None:
        self.task: asyncio.Task[Any] | None = None
        self.gone = False
        self.close_client: Any = None  # set by the protocol: ends the client's connection

    def lost(self) -> None:
        self.gone = True
        if self.task is not None and not self.task.done():
            self.task.cancel()


class Attempt:
    """The request body for each replica tried: what was kept, then the rest as the client
    sends it (a body of at most REPLAY_MAX_BYTES is kept for a retry elsewhere)."""

    __slots__ = ("receive", "limit", "framing", "kept", "size", "ended", "started")

    def __init__(self, receive: Any, limit: int, framing: wire.Framing) -> None:
        self.receive = receive
        self.limit = limit
        self.framing = framing
        self.kept: list[bytes] | None = []
        self.size = 0
        self.ended = not framing.streamed
        self.started = False

    def replayable(self) -> bool:
        return not self.started or self.kept is not None

    async def send(self, conn: Upstream) -> None:
        chunked = self.framing.chunked
        for piece in list(self.kept or ()):
            await conn.write(wire.chunk(piece) if chunked else piece)
        while not self.ended:
            message = await self.receive()
            if message["type"] != "http.request":
                raise asyncio.CancelledError  # the client left (the watch cancels us too)
            piece = message.get("body", b"")
            self.ended = not message.get("more_body", False)
            self.size += len(piece)
            if self.size > self.limit:
                raise BodyTooLarge(self.limit)
            if self.kept is not None:
                if self.size > REPLAY_MAX_BYTES:
                    self.kept = None
                elif piece:  # (an empty piece, chunked, would be the last chunk)
                    self.kept.append(piece)
            self.started = True
            if piece:
                await conn.write(wire.chunk(piece) if chunked else piece)
        if chunked:
            await conn.write(wire.LAST_CHUNK)


class ServeDataPlane:
    """An ASGI callable for `/serve/{target}/{path}` requests, one per gateway process."""

    def __init__(self, app: Any) -> None:
        self.app = app  # the API application: its router, credential cache and settings
        self.pool = UpstreamPool()
        self._served: dict[tuple[str, str], Any] = {}
        self._http: dict[tuple[str, str], Any] = {}
        self._latency: dict[str, Any] = {}

    def router(self) -> ServingRouter:
        state = self.app.state
        if state.serving is None:
            state.serving = ServingRouter(state.store, state.settings, state.nc)
        serving: ServingRouter = state.serving
        return serving

    # --- counters (children looked up once) --------------------------------------------

    def _count(self, target: str, status: int) -> None:
        key = (target, str(status))
        child = self._served.get(key)
        if child is None:
            child = self._served[key] = SERVE_REQUESTS.labels(*key)
        child.inc()

    def _count_http(self, method: str, status: int, seconds: float) -> None:
        key = (method, str(status))
        child = self._http.get(key)
        if child is None:
            child = self._http[key] = http_metrics.REQUESTS.labels(method, ROUTE, key[1])
        child.inc()
        hist = self._latency.get(method)
        if hist is None:
            hist = self._latency[method] = http_metrics.LATENCY.labels(method, ROUTE)
        hist.observe(seconds)

    # --- one request ---------------------------------------------------------------------

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        watch: ClientWatch = scope.get("extensions", {}).get("heteroflow.client") or ClientWatch()
        task = asyncio.current_task()
        watch.task = task
        began = time.perf_counter()
        state = {"status": 500}
        try:
            await self._serve(scope, receive, send, watch, state)
        except asyncio.CancelledError:
            if not watch.gone or task is None:
                raise
            task.uncancel()
            state["status"] = 499
        finally:
            # The watch's close_client holds the client's cycle, whose scope holds the watch:
            # unlinked here, the request's objects go with their last reference instead of
            # waiting, as a cycle, for a full collection (60 ms pauses under load).
            watch.task = None
            watch.close_client = None
            self._count_http(scope["method"], state["status"], time.perf_counter() - began)

    async def _serve(
        self, scope: Any, receive: Any, send: Any, watch: ClientWatch, state: dict[str, int]
    ) -> None:
        target_id = wire.target_of(scope["path"]) or ""
        try:
            serving = self.router()
            if wire.has_nul(scope["path"], scope["query_string"]):
                raise DomainError(Code.INVALID_VALUE, "NUL character in the URL", ["url"])
            principal = await self._principal(scope, serving)
            t = await serving.target(
                target_id, principal.tenant_id if principal.is_tenant else None
            )
            framing = wire.Framing(scope["headers"])
            limit = serving.settings.serve_max_body_bytes
            if framing.length is not None and framing.length > limit:
                raise BodyTooLarge(limit)
            serving.admit(t)
            await self._proxy(
                serving, t, scope, Attempt(receive, limit, framing), send, watch, state
            )
        except asyncio.CancelledError:
            if watch.gone and not state.get("answered") and target_id in self.router().targets:
                self._count(target_id, 499)  # nginx's "client closed request"
            raise
        except ServeUnavailable as exc:
            self._count(target_id, 503)
            retry = [(b"retry-after", str(exc.retry_after_s).encode())]
            await _answer(send, state, 503, wire.error_json(exc.message, exc.code), retry)
        except DomainError as exc:
            headers = []
            if isinstance(exc, Throttled):
                headers = [(b"retry-after", str(exc.retry_after_s).encode())]
            body = wire.error_json(exc.message, exc.code, exc.fields)
            await _answer(send, state, exc.http_status, body, headers)
        except StoreUnavailable as exc:
            log.warning("store_unavailable", path=scope["path"], error=str(exc)[:300])
            body = wire.error_json(
                "the database is unavailable; nothing was changed, retry later",
                Code.STORE_UNAVAILABLE,
            )
            retry = [(b"retry-after", str(STORE_RETRY_AFTER_S).encode())]
            await _answer(send, state, 503, body, retry)
        except Exception as exc:
            log.exception("unhandled_error", path=scope["path"], error=str(exc))
            await _answer(send, state, 500, wire.error_json("internal error", INTERNAL_ERROR))

    async def _principal(self, scope: Any, serving: ServingRouter) -> auth.Principal:
        """The caller, as the API's `get_principal` finds it (the same credential cache: a
        known key costs no store read)."""
        header = ""
        for name, value in scope["headers"]:
            if name == b"authorization":
                header = value.decode("latin-1")
                break
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise DomainError(
                Code.UNAUTHENTICATED, "missing bearer token (Authorization: Bearer <token>)"
            )
        secret = serving.settings.jwt_secret
        principal = await auth.authenticate(
            serving.store,
            token.strip(),
            secret.get_secret_value() if secret else None,
            self.app.state.auth_cache,
        )
        if principal.role is auth.Role.AGENT:
            raise DomainError(
                Code.FORBIDDEN,
                "an agent key may only report on tasks of its own node (PUT /api/v1/tasks/{id})",
            )
        return principal

    async def _proxy(
        self,
        serving: ServingRouter,
        t: Target,
        scope: Any,
        body: Attempt,
        send: Any,
        watch: ClientWatch,
        state: dict[str, int],
    ) -> None:
        method: str = scope["method"]
        target = wire.upstream_path(scope["raw_path"], scope["query_string"])
        lines = wire.forwarded_headers(scope["headers"], body.framing)
        settings = serving.settings
        first_byte_s = min(settings.serve_first_byte_timeout_s, settings.serve_upstream_timeout_s)
        tried: set[str] = set()
        failures: list[str] = []
        conn: Upstream | None = None
        while True:
            replica = await serving.acquire(t, tried)
            started = time.perf_counter()
            replica.outstanding += 1
            replica.last_pick = next(PICKS)
            t.window.concurrent += 1
            conn = None
            try:
                conn = await self.pool.get(replica.address)
                head = wire.request_head(method, target, replica.address, lines)
                try:
                    status = await _exchange(conn, head, method, body, first_byte_s)
                except UpstreamError as exc:
                    stale = conn.exchanges > 1 and not conn.got_bytes
                    if not stale or isinstance(exc, UpstreamTimeout) or not body.replayable():
                        raise
                    # A kept-alive connection the replica had closed: once more, afresh.
                    conn.abort()
                    conn = await self.pool.get(replica.address, fresh=True)
                    status = await _exchange(conn, head, method, body, first_byte_s)
            except UpstreamTimeout:
                _abort(conn)
                _done(serving, t, replica, started)
                self._count(t.id, 504)
                raise DomainError(
                    Code.UPSTREAM_TIMEOUT,
                    f"{t.id}: {replica.task_id} at {replica.address} did not begin its answer "
                    f"within {first_byte_s:g}s of getting the request "
                    "(HETEROFLOW_SERVE_FIRST_BYTE_TIMEOUT_S)",
                ) from None
            except UpstreamError as exc:
                _abort(conn)
                _done(serving, t, replica, started)
                failures.append(f"{replica.task_id} at {replica.address}: {exc.name}")
                retry = exc.name == "ConnectError" or method in IDEMPOTENT
                replica.ready = exc.name not in ("ConnectError", "RemoteProtocolError")
                replica.last_error = str(exc) or exc.name
                tried.add(replica.task_id)
                others = [r for r in t.replicas.values() if r.ready and r.task_id not in tried]
                if retry and others and body.replayable():
                    continue
                self._count(t.id, 502)
                raise DomainError(
                    Code.UPSTREAM_FAILED, f"{t.id}: upstream failed: {'; '.join(failures)}"
                ) from None
            except BaseException:  # the client left, the body was too large, ...
                _abort(conn)
                _done(serving, t, replica, started)
                raise
            break
        body.kept = None
        assert conn is not None
        conn.silence_within(settings.serve_upstream_timeout_s)
        try:
            self._count(t.id, status)
            state["status"] = status
            state["answered"] = 1
            headers = wire.answer_headers(conn.headers, replica.task_id.encode())
            await send({"type": "http.response.start", "status": status, "headers": headers})
            while True:
                try:
                    data = await conn.read()
                except UpstreamError as exc:
                    # The replica went away mid-answer: this answer fails, and only it.
                    log.warning(
                        "serve_stream_broken", target=t.id, task_id=replica.task_id, error=str(exc)
                    )
                    if watch.close_client is not None:
                        watch.close_client()
                    return
                if data is None:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    break
                last = conn.at_end
                await send({"type": "http.response.body", "body": data, "more_body": not last})
                if last:
                    break
            conn.release()
            conn = None
        finally:
            _abort(conn)
            _done(serving, t, replica, started)


async def _exchange(
    conn: Upstream, head: bytes, method: str, body: Attempt, first_byte_s: float
) -> int:
    """Send the request (head, then its body as the client sends it) and wait for the head
    of the answer: its status."""
    conn.begin(head, head_only=method == "HEAD")
    if body.framing.streamed:
        await body.send(conn)
    conn.first_byte_within(first_byte_s)
    return await conn.head()


def _abort(conn: Upstream | None) -> None:
    if conn is not None:
        conn.abort()


def _done(serving: ServingRouter, t: Target, replica: Any, started: float) -> None:
    replica.outstanding -= 1
    t.window.concurrent -= 1
    t.window.finished(serving.clock(), time.perf_counter() - started)
    t.last_activity = serving.clock()


async def _answer(
    send: Any,
    state: dict[str, int],
    status: int,
    body: bytes,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    state["status"] = status
    start = [*wire.JSON_HEADERS, (b"content-length", str(len(body)).encode()), *(headers or ())]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": body, "more_body": False})
