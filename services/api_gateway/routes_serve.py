"""`ANY /serve/{target}/{path}`: the inference router, and `GET …/serving` (docs/serving.md).

Requests go to a ready replica with the fewest outstanding requests; the response streams
back as it arrives (chunked and SSE bodies pass through unbuffered) on the gateway's event
loop through one shared `httpx.AsyncClient`. The request body streams too, read from the
client as the replica takes it (`Inbound`: a chunk or two per request in the gateway, however
large the body, up to `HETEROFLOW_SERVE_MAX_BODY_BYTES`), so concurrent uploads cost the
gateway no memory of their size. `Inbound` is also the only reader of the client's ASGI
`receive`: a client that leaves while its request waits for a replica or for the replica's
first byte cancels the upstream request at once (the connection is closed, the replica's
outstanding count released), and a replica that has not begun its answer
`HETEROFLOW_SERVE_FIRST_BYTE_TIMEOUT_S` after it got the whole request gets 504.

The gateway's HTTP protocol sends `/serve/` requests to its own data path (dataplane/)
instead, with the same decisions and answers; this route serves them with
`HETEROFLOW_SERVE_DATAPLANE=false` (and when the app runs without that protocol, as under
an ASGI test client).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import structlog
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from libs.domain.errors import Code, DomainError
from libs.domain.group.serving import Replica

from .deps import Principal, tenant_scope
from .errors import error_body
from .limits import BodyTooLarge
from .responses import FastJSONResponse
from .serving import SERVE_REQUESTS, ServeUnavailable, ServingRouter, Target

log = structlog.get_logger(__name__)
router = APIRouter(tags=["serving"])

PICKS = itertools.count(1)
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
IDEMPOTENT = {"GET", "HEAD", "OPTIONS", "PUT", "DELETE"}
# Hop-by-hop headers (RFC 9110 §7.6.1) and the platform's own credential stay here.
HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "authorization",
    "content-length",
}


def _router(request: Request) -> ServingRouter:
    state = request.app.state
    if state.serving is None:
        state.serving = ServingRouter(state.store, state.settings, state.nc)
    serving: ServingRouter = state.serving
    return serving


# A body this small is also kept until the answer starts, so a request the replica failed
# after taking part of it can still be sent again to another (a retry of a GET, PUT, ...).
REPLAY_MAX_BYTES = 64 * 1024
_END: Message = {"type": "heteroflow.end"}  # the pump ended on an error (a sentinel)


class ClientGone(Exception):
    """The client disconnected before its answer began."""


class UpstreamTimeout(DomainError):
    def __init__(self, message: str) -> None:
        super().__init__(Code.UPSTREAM_TIMEOUT, message)


class Inbound:
    """The client's side of one proxied request: the only reader of its ASGI `receive`.

    A pump task reads the body into a queue of two messages (the client is held back by
    TCP while the replica has not taken them) and then waits for `http.disconnect`. A
    disconnect cancels the task inside `cancelling()` (the wait for a replica and for the
    replica's first byte: httpx then closes the upstream connection) and ends the
    response's own disconnect listener (`receive`)."""

    def __init__(self, receive: Receive, limit: int) -> None:
        self._receive = receive
        self.limit = limit
        self.gone = asyncio.Event()
        self._queue: asyncio.Queue[Message] = asyncio.Queue(maxsize=2)
        self._error: BaseException | None = None
        self._pump: asyncio.Task[None] | None = None
        self._holder: asyncio.Task[Any] | None = None
        self._cancelled = False
        self.started = False  # a byte of the body was handed to a replica
        self.ended = False  # the whole body was read from the client
        self._kept: list[bytes] | None = []  # the body read so far, while small
        self._kept_size = 0

    def start(self) -> None:
        self._pump = asyncio.create_task(self._run())

    def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()  # not awaited: it holds nothing but a wait on `receive`

    async def _run(self) -> None:
        reading = True
        try:
            while True:
                message = await self._receive()
                if message["type"] == "http.disconnect":
                    break
                if reading and message["type"] == "http.request":
                    await self._queue.put(message)
                    reading = bool(message.get("more_body", False))
        except Exception as exc:  # e.g. a body read timeout at the edge: the reader raises it
            self._error = exc
            await self._queue.put(_END)
            return
        self.gone.set()
        if self._holder is not None:
            self._cancelled = True
            self._holder.cancel()

    def cancelling(self) -> Inbound:
        """`async with inbound.cancelling():` the block is cancelled when the client
        leaves; it then raises `ClientGone` (asyncio.timeout's way, with `uncancel`)."""
        return self

    async def __aenter__(self) -> None:
        if self.gone.is_set():
            raise ClientGone
        self._holder = asyncio.current_task()

    async def __aexit__(self, kind: type[BaseException] | None, *_: object) -> None:
        task, self._holder = self._holder, None
        if self._cancelled and task is not None:
            left = task.uncancel()  # our cancel is answered here, not passed on
            if kind is asyncio.CancelledError and left == 0:
                raise ClientGone

    async def receive(self) -> Message:
        """For the streamed answer's disconnect listener."""
        await self.gone.wait()
        return {"type": "http.disconnect"}

    def replayable(self) -> bool:
        """Whether the body can be sent (again) to a replica."""
        return not self.started or self._kept is not None

    async def body(self, sent: Callable[[], None]) -> AsyncIterator[bytes]:
        """The body for one attempt: what was kept, then the rest as the client sends it;
        `sent()` once the replica has taken it all."""
        for chunk in list(self._kept or ()):
            yield chunk
        while not self.ended:
            message = await self._queue.get()
            if message is _END:
                assert self._error is not None
                raise self._error
            chunk = message.get("body", b"")
            self.ended = not message.get("more_body", False)
            self._kept_size += len(chunk)
            if self._kept_size > self.limit:
                raise BodyTooLarge(self.limit)
            if self._kept is not None:
                if self._kept_size <= REPLAY_MAX_BYTES:
                    self._kept.append(chunk)
                else:
                    self._kept = None
            self.started = True
            if chunk:
                yield chunk
        sent()

    def answered(self) -> None:
        """The replica's answer began: the body is not needed again."""
        self._kept = None


def _has_body(request: Request) -> bool:
    """HTTP/1.1 framing: a request has a body only with a Content-Length or chunked."""
    declared = request.headers.get("content-length")
    if declared is not None:
        return declared != "0"
    return "chunked" in request.headers.get("transfer-encoding", "").lower()


@router.api_route("/serve/{target_id}/{path:path}", methods=METHODS, include_in_schema=False)
async def serve(request: Request, target_id: str, path: str, principal: Principal) -> Response:
    serving = _router(request)
    limit = serving.settings.serve_max_body_bytes
    inbound = Inbound(request.receive, limit)
    handed = False
    try:
        t = await serving.target(target_id, tenant_scope(principal))
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise BodyTooLarge(limit)
        serving.admit(t)
        inbound.start()
        async with inbound.cancelling():
            response = await _proxy(serving, t, request, path, inbound)
        handed = True
        return response
    except ServeUnavailable as exc:
        SERVE_REQUESTS.labels(target_id, "503").inc()
        return FastJSONResponse(
            error_body(exc.message, exc.code),
            503,
            headers={"Retry-After": str(exc.retry_after_s)},
        )
    except ClientGone:
        # Nobody reads this answer; 499 (nginx's "client closed request") in the figures.
        SERVE_REQUESTS.labels(target_id, "499").inc()
        return Response(status_code=499)
    finally:
        if not handed:
            inbound.close()


async def _proxy(
    serving: ServingRouter, t: Target, request: Request, path: str, inbound: Inbound
) -> Response:
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP]
    streamed = _has_body(request)
    if streamed and "content-length" in request.headers:  # the same framing to the replica
        headers.append(("content-length", request.headers["content-length"]))
    query = request.url.query
    tried: set[str] = set()
    failures: list[str] = []
    first_byte_s = serving.settings.serve_first_byte_timeout_s
    loop = asyncio.get_running_loop()
    while True:
        replica = await serving.acquire(t, tried)
        url = f"http://{replica.address}/{path}" + (f"?{query}" if query else "")
        started = time.perf_counter()
        replica.outstanding += 1
        replica.last_pick = next(PICKS)
        t.window.concurrent += 1
        try:
            async with asyncio.timeout(None) as deadline:

                def sent(deadline: asyncio.Timeout = deadline) -> None:
                    deadline.reschedule(loop.time() + first_byte_s)

                if streamed:
                    content: Any = inbound.body(sent)
                else:
                    content = b""
                    sent()
                upstream = serving.client.build_request(
                    request.method, url, headers=headers, content=content
                )
                resp = await serving.client.send(upstream, stream=True)
        except (TimeoutError, httpx.ReadTimeout):  # ours, or httpx's read timeout if shorter
            _done(serving, t, replica, started)
            SERVE_REQUESTS.labels(t.id, "504").inc()
            waited = min(first_byte_s, serving.settings.serve_upstream_timeout_s)
            raise UpstreamTimeout(
                f"{t.id}: {replica.task_id} at {replica.address} did not begin its answer "
                f"within {waited:g}s of getting the request "
                "(HETEROFLOW_SERVE_FIRST_BYTE_TIMEOUT_S)"
            ) from None
        except httpx.HTTPError as exc:
            _done(serving, t, replica, started)
            failures.append(f"{replica.task_id} at {replica.address}: {type(exc).__name__}")
            # Not delivered (refused) or safe to repeat: another replica may answer.
            retry = isinstance(exc, httpx.ConnectError) or request.method in IDEMPOTENT
            replica.ready = not isinstance(exc, httpx.ConnectError | httpx.RemoteProtocolError)
            replica.last_error = str(exc) or type(exc).__name__
            tried.add(replica.task_id)
            others = [r for r in t.replicas.values() if r.ready and r.task_id not in tried]
            if retry and others and (not streamed or inbound.replayable()):
                continue
            SERVE_REQUESTS.labels(t.id, "502").inc()
            raise DomainError(
                Code.UPSTREAM_FAILED, f"{t.id}: upstream failed: {'; '.join(failures)}"
            ) from None
        except BaseException:  # the client left, the body was too large, ...
            _done(serving, t, replica, started)
            raise
        inbound.answered()
        return _stream(serving, t, replica, resp, started, inbound)


def _done(serving: ServingRouter, t: Target, replica: Replica, started: float) -> None:
    replica.outstanding -= 1
    t.window.concurrent -= 1
    t.window.finished(serving.clock(), time.perf_counter() - started)
    t.last_activity = serving.clock()


class _Proxied(StreamingResponse):
    """A streamed upstream answer that always releases its upstream response and counters,
    also when the client leaves before the body starts (the body generator then never runs,
    so its own `finally` cannot)."""

    def __init__(
        self,
        body: AsyncIterator[bytes],
        done: Callable[[], Awaitable[None]],
        inbound: Inbound,
        **kw: Any,
    ):
        super().__init__(body, **kw)
        self._done = done
        self._inbound = inbound

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            # The request's pump is the only reader of `receive`: it says when the client left.
            await super().__call__(scope, self._inbound.receive, send)
        finally:
            await self._done()
            self._inbound.close()


def _stream(
    serving: ServingRouter,
    t: Target,
    replica: Replica,
    resp: httpx.Response,
    started: float,
    inbound: Inbound,
) -> StreamingResponse:
    finished = False

    async def done() -> None:
        nonlocal finished
        if not finished:
            finished = True
            await resp.aclose()
            _done(serving, t, replica, started)

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in resp.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:  # the replica went away mid-body: the answer ends
            log.warning("serve_stream_broken", target=t.id, task_id=replica.task_id, error=str(exc))
        finally:
            await done()

    SERVE_REQUESTS.labels(t.id, str(resp.status_code)).inc()
    headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP}
    headers["x-heteroflow-replica"] = replica.task_id
    if "content-length" in resp.headers:  # the raw (still encoded) bytes pass through as is
        headers["content-length"] = resp.headers["content-length"]
    return _Proxied(body(), done, inbound, status_code=resp.status_code, headers=headers)


def serving_view(serving: ServingRouter, t: Target) -> dict[str, Any]:
    return {
        "id": t.id,
        "serving": t.serving.model_dump(mode="json") if t.serving else None,
        "idle_timeout_minutes": t.idle_timeout_minutes,
        "replicas": [
            {
                "task_id": m.id,
                "status": m.status.value,
                "address": m.serve_address,
                "ready": bool(r and r.ready),
                "draining": bool(r and r.draining),
                "outstanding": r.outstanding if r else 0,
                "last_error": r.last_error if r else "",
            }
            for m in t.members
            for r in [t.replicas.get(m.id)]
        ],
        **t.window.figures(serving.clock()),
    }


@router.get("/api/v1/task-groups/{group_id}/serving", tags=["task-groups"])
async def group_serving(request: Request, group_id: str, principal: Principal) -> JSONResponse:
    """Replicas, readiness and the router's four figures for an inference group."""
    if not group_id.startswith("grp-"):
        raise DomainError(Code.NOT_FOUND, "task group not found")
    serving = _router(request)
    t = await serving.target(group_id, tenant_scope(principal))
    return FastJSONResponse(serving_view(serving, t))


@router.get("/api/v1/tasks/{task_id}/serving", tags=["tasks"])
async def task_serving(request: Request, task_id: str, principal: Principal) -> JSONResponse:
    """The same for a single inference task."""
    serving = _router(request)
    t = await serving.target(task_id, tenant_scope(principal))
    return FastJSONResponse(serving_view(serving, t))
