"""Limits at the edge: the request body size, media type, encoding and JSON shape.

`BodyLimit` is plain ASGI middleware: it refuses a declared `Content-Length` over the limit
before a byte of the body is read, and counts the bytes of a body sent without one (chunked),
so no request body larger than the limit is ever held in memory. It reads the whole body
before the request goes on, to the shedding bounds and the handler: a slot in flight is
taken by a request ready to be worked on, not by a client still sending. `read_json_object` is what
every endpoint taking a body uses: JSON only (415 otherwise), UTF-8 only, bounded nesting, no
NUL; each refusal in the error shape of SPEC §2.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote_to_bytes

import orjson
from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from libs.domain.errors import Code, DomainError
from libs.domain.validation import check_json_document

JSON_MEDIA_TYPE = "application/json"


class BodyTooLarge(DomainError):
    def __init__(self, limit: int) -> None:
        super().__init__(
            Code.PAYLOAD_TOO_LARGE, f"request body is larger than {limit} bytes", ["body"]
        )


class BodyLimit:
    """Refuse request bodies over `max_bytes` (413) and NUL in the path or query (400)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await JSONResponse(_body(refusal), refusal.http_status)(scope, receive, send)
            return
        if scope.get("path", "").startswith("/serve/"):
            # The router has its own, larger limit (HETEROFLOW_SERVE_MAX_BODY_BYTES).
            await self.app(scope, receive, send)
            return
        # The whole body is read here, before the request takes a slot in flight
        # (shedding.py, inside this one): a client sending slowly holds its own connection
        # only (its time is bounded by the body deadline, connections.py), not a slot the
        # other tenants' requests need.
        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client has gone: nothing to answer
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > self.max_bytes:
                exc = BodyTooLarge(self.max_bytes)
                await JSONResponse(_body(exc), exc.http_status)(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    def _refusal(self, scope: Scope) -> DomainError | None:
        if "\x00" in scope.get("path", "") or b"\x00" in unquote_to_bytes(
            scope.get("query_string", b"")
        ):
            return DomainError(Code.INVALID_VALUE, "NUL character in the URL", ["url"])
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and not scope.get("path", "").startswith("/serve/"):
                if not value.isdigit():
                    return DomainError(
                        Code.INVALID_VALUE, "Content-Length is not a number", ["content-length"]
                    )
                if int(value) > self.max_bytes:
                    return BodyTooLarge(self.max_bytes)
        return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """`receive` for the app: the body read, then what the connection says (a disconnect)."""
    pending = True

    async def replayed() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def _body(exc: DomainError) -> dict[str, Any]:
    body: dict[str, Any] = {"error": exc.message, "code": int(exc.code)}
    if exc.fields:
        body["fields"] = exc.fields
    return body


def _standard_loads(text: str, depth: int) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise DomainError(
            Code.INVALID_VALUE, f"JSON nesting is deeper than {depth} levels", ["body"]
        ) from None
    except ValueError as exc:
        raise DomainError(Code.INVALID_VALUE, f"request body is not valid JSON: {exc}") from None


def check_media_type(request: Request) -> None:
    """JSON bodies only: `application/json` (or a `+json` type), UTF-8 if a charset is named."""
    header = request.headers.get("content-type")
    if header is None:
        raise DomainError(
            Code.UNSUPPORTED_MEDIA_TYPE,
            f"Content-Type is missing; send {JSON_MEDIA_TYPE}",
            ["content-type"],
        )
    media, *params = (p.strip().lower() for p in header.split(";"))
    charset = next((p.partition("=")[2].strip('"') for p in params if p.startswith("charset=")), "")
    if not (media == JSON_MEDIA_TYPE or media.endswith("+json")) or charset not in (
        "",
        "utf-8",
        "utf8",
    ):
        raise DomainError(
            Code.UNSUPPORTED_MEDIA_TYPE,
            f"Content-Type {header!r} is not accepted; send {JSON_MEDIA_TYPE} (UTF-8)",
            ["content-type"],
        )


async def read_json_object(request: Request) -> dict[str, Any]:
    """The body as a JSON object, or a DomainError naming what is wrong with it."""
    check_media_type(request)
    raw = await request.body()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DomainError(
            Code.INVALID_VALUE, f"request body is not valid UTF-8 (byte {exc.start})", ["body"]
        ) from None
    if not text.strip():
        raise DomainError(Code.INVALID_VALUE, "request body is empty; a JSON object is expected")
    depth = request.app.state.settings.max_json_depth
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        # orjson is stricter than the standard parser (NaN, integers past 64 bits, lone
        # surrogates, nesting past 1024): what it refuses gets the standard parser's answer.
        data = _standard_loads(text, depth)
    if not isinstance(data, dict):
        raise DomainError(Code.INVALID_VALUE, "request body must be a JSON object", ["body"])
    check_json_document(data, depth)
    return data
