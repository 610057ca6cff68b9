"""`ANY /serve/{target}/{path}`: the inference router, and `GET …/serving` (docs/serving.md).

Requests go to a ready replica with the fewest outstanding requests; the response streams
back as it arrives (chunked and SSE bodies pass through unbuffered) on the gateway's event
loop through one shared `httpx.AsyncClient`. The request body is read whole (it is bounded by
`HETEROFLOW_SERVE_MAX_BODY_BYTES`), so a replica that refuses the connection can be skipped
for another without losing it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import structlog
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

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


async def _body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


@router.api_route("/serve/{target_id}/{path:path}", methods=METHODS, include_in_schema=False)
async def serve(request: Request, target_id: str, path: str, principal: Principal) -> Response:
    serving = _router(request)
    try:
        t = await serving.target(target_id, tenant_scope(principal))
        body = await _body(request, serving.settings.serve_max_body_bytes)
        return await _proxy(serving, t, request, path, body)
    except ServeUnavailable as exc:
        SERVE_REQUESTS.labels(target_id, "503").inc()
        return FastJSONResponse(
            error_body(exc.message, exc.code),
            503,
            headers={"Retry-After": str(exc.retry_after_s)},
        )


async def _proxy(
    serving: ServingRouter, t: Target, request: Request, path: str, body: bytes
) -> Response:
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP]
    query = request.url.query
    tried: set[str] = set()
    failures: list[str] = []
    while True:
        replica = await serving.acquire(t, tried)
        url = f"http://{replica.address}/{path}" + (f"?{query}" if query else "")
        upstream = serving.client.build_request(request.method, url, headers=headers, content=body)
        started = time.perf_counter()
        replica.outstanding += 1
        replica.last_pick = next(PICKS)
        t.window.concurrent += 1
        try:
            resp = await serving.client.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            _done(serving, t, replica, started)
            failures.append(f"{replica.task_id} at {replica.address}: {type(exc).__name__}")
            # Not delivered (refused) or safe to repeat: another replica may answer.
            retry = isinstance(exc, httpx.ConnectError) or request.method in IDEMPOTENT
            replica.ready = not isinstance(exc, httpx.ConnectError | httpx.RemoteProtocolError)
            replica.last_error = str(exc) or type(exc).__name__
            tried.add(replica.task_id)
            others = [r for r in t.replicas.values() if r.ready and r.task_id not in tried]
            if retry and others:
                continue
            SERVE_REQUESTS.labels(t.id, "502").inc()
            raise DomainError(
                Code.UPSTREAM_FAILED, f"{t.id}: upstream failed: {'; '.join(failures)}"
            ) from None
        return _stream(serving, t, replica, resp, started)


def _done(serving: ServingRouter, t: Target, replica: Replica, started: float) -> None:
    replica.outstanding -= 1
    t.window.concurrent -= 1
    t.window.finished(serving.clock(), time.perf_counter() - started)
    t.last_activity = serving.clock()


class _Proxied(StreamingResponse):
    """A streamed upstream answer that always releases its upstream response and counters,
    also when the client leaves before the body starts (the body generator then never runs,
    so its own `finally` cannot)."""

    def __init__(self, body: AsyncIterator[bytes], done: Callable[[], Awaitable[None]], **kw: Any):
        super().__init__(body, **kw)
        self._done = done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._done()


def _stream(
    serving: ServingRouter, t: Target, replica: Replica, resp: httpx.Response, started: float
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
    return _Proxied(body(), done, status_code=resp.status_code, headers=headers)


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
