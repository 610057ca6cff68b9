"""Every refusal as `{"error": str, "code": int, "fields": [...]}` with the SPEC §2 codes.

Framework errors (malformed JSON, unknown route, wrong method, bad query types) are mapped
here too, so no request gets a bare framework error or a stack trace.
"""

from __future__ import annotations

from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from libs.domain.errors import Code, DomainError, StoreUnavailable, Throttled

from .responses import FastJSONResponse

log = structlog.get_logger(__name__)

INTERNAL_ERROR = 50000
STORE_RETRY_AFTER_S = 2


def error_body(message: str, code: int, fields: list[str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"error": message, "code": int(code)}
    if fields:
        body["fields"] = fields
    return body


def install(app: FastAPI) -> None:
    @app.exception_handler(DomainError)
    async def _domain(_: Request, exc: DomainError) -> JSONResponse:
        headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, Throttled) else None
        body = error_body(exc.message, exc.code, exc.fields)
        return FastJSONResponse(body, exc.http_status, headers=headers)

    @app.exception_handler(StoreUnavailable)
    async def _store_down(request: Request, exc: StoreUnavailable) -> JSONResponse:
        # The database is away or every connection is busy past the wait: nothing was
        # written (a transaction that did not commit is not there), and a retry may work.
        log.warning("store_unavailable", path=request.url.path, error=str(exc)[:300])
        body = error_body(
            "the database is unavailable; nothing was changed, retry later",
            Code.STORE_UNAVAILABLE,
        )
        return FastJSONResponse(body, 503, headers={"Retry-After": str(STORE_RETRY_AFTER_S)})

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        fields = [".".join(str(p) for p in e["loc"][1:]) or "body" for e in exc.errors()]
        msgs = "; ".join(f"{f}: {e['msg']}" for f, e in zip(fields, exc.errors(), strict=True))
        return FastJSONResponse(
            error_body(f"invalid value: {msgs}", Code.INVALID_VALUE, fields), 400
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        mapping = {401: Code.UNAUTHENTICATED, 403: Code.FORBIDDEN, 404: Code.NOT_FOUND}
        code = mapping.get(exc.status_code, exc.status_code * 100)
        headers = getattr(exc, "headers", None)
        message = str(exc.detail)
        if exc.status_code == 405:
            # Starlette names only the methods of the first route on the path; name them all.
            allowed = _allowed_methods(request)
            headers = {"Allow": ", ".join(allowed)}
            message = (
                f"method {request.method} is not allowed on {request.url.path}; "
                f"allowed: {', '.join(allowed)}"
            )
        return FastJSONResponse(error_body(message, code), exc.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # A bug: logged with its stack, answered without internals.
        log.exception("unhandled_error", path=request.url.path, error=str(exc))
        return FastJSONResponse(error_body("internal error", INTERNAL_ERROR), 500)


def _allowed_methods(request: Request) -> list[str]:
    """The methods the API documents for the request's path: those of the most specific
    template that matches it (`/tasks/stats` is its own path, not a `/tasks/{task_id}`)."""
    asked = request.url.path.rstrip("/").split("/")
    best, methods = -1, set[str]()
    for template, item in request.app.openapi().get("paths", {}).items():
        parts = template.rstrip("/").split("/")
        if len(parts) == len(asked) and all(
            p == a or (p.startswith("{") and p.endswith("}") and a)
            for p, a in zip(parts, asked, strict=True)
        ):
            literal = sum(not p.startswith("{") for p in parts)
            if literal > best:
                best, methods = literal, set()
            if literal == best:
                methods |= {m.upper() for m in item}
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)
