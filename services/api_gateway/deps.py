"""Request dependencies: the store, the caller's principal, a JSON object body."""

from __future__ import annotations

import json
from typing import Annotated, Any

import orjson
from fastapi import Depends, Request

from libs import auth
from libs.domain.errors import Code, DomainError
from libs.store.eventstore import EventStore


async def get_store(request: Request) -> EventStore:
    # async: FastAPI runs a plain `def` dependency in a worker thread, a thread hand-off
    # per request for an attribute read.
    store: EventStore = request.app.state.store
    return store


async def get_principal(
    request: Request, store: Annotated[EventStore, Depends(get_store)]
) -> auth.Principal:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise DomainError(
            Code.UNAUTHENTICATED, "missing bearer token (Authorization: Bearer <token>)"
        )
    secret = request.app.state.settings.jwt_secret
    return await auth.authenticate(
        store,
        token.strip(),
        secret.get_secret_value() if secret else None,
        request.app.state.auth_cache,
    )


Principal = Annotated[auth.Principal, Depends(get_principal)]
Store = Annotated[EventStore, Depends(get_store)]


async def json_object(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        raise DomainError(Code.INVALID_VALUE, "request body is empty; a JSON object is expected")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        # orjson is stricter than the standard parser (NaN, integers past 64 bits, lone
        # surrogates): what it refuses gets the standard parser's answer, as before.
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DomainError(
                Code.INVALID_VALUE, f"request body is not valid JSON: {exc}"
            ) from None
    if not isinstance(data, dict):
        raise DomainError(Code.INVALID_VALUE, "request body must be a JSON object", ["body"])
    return data


Body = Annotated[dict[str, Any], Depends(json_object)]


def require_operator(principal: auth.Principal) -> None:
    if principal.role is not auth.Role.OPERATOR:
        raise DomainError(Code.FORBIDDEN, "operator credential required")


def tenant_scope(principal: auth.Principal) -> str | None:
    """Tenants see their own tenant; operators and agents see all (None)."""
    return principal.tenant_id if principal.is_tenant else None
