"""Request dependencies: the store and the caller's principal (bodies and queries: schemas.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from libs import auth
from libs.domain.errors import Code, DomainError
from libs.store.eventstore import EventStore

from .shedding import READ_METHODS, ROUTED_PREFIX


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
    principal = await auth.authenticate(
        store,
        token.strip(),
        secret.get_secret_value() if secret else None,
        request.app.state.auth_cache,
    )
    if (
        principal.is_tenant
        and request.method not in READ_METHODS
        and not request.url.path.startswith(ROUTED_PREFIX)
    ):
        request.app.state.tenant_rates.take(principal.tenant_id)
    if principal.role is auth.Role.AGENT:
        _agent_may(request)
    return principal


# The one thing an agent key may do in the API: report on a task of its own node (the
# report path checks the node). Everything else, reads included, is refused here, once,
# rather than in each route.
AGENT_ROUTES = frozenset({("PUT", "/api/v1/tasks/{task_id}")})


def _agent_may(request: Request) -> None:
    route = request.scope.get("route")
    path = getattr(route, "path", request.url.path)
    if (request.method, path) not in AGENT_ROUTES:
        raise DomainError(
            Code.FORBIDDEN,
            "an agent key may only report on tasks of its own node (PUT /api/v1/tasks/{id})",
        )


Principal = Annotated[auth.Principal, Depends(get_principal)]
Store = Annotated[EventStore, Depends(get_store)]


def require_operator(principal: auth.Principal) -> None:
    if principal.role is not auth.Role.OPERATOR:
        raise DomainError(Code.FORBIDDEN, "operator credential required")


def tenant_scope(principal: auth.Principal) -> str | None:
    """Tenants see their own tenant; operators and agents see all (None)."""
    return principal.tenant_id if principal.is_tenant else None


def page_query(request: Request) -> tuple[int, int, str | None]:
    """(page, per_page, status) of a list of groups or jobs; anything else in the query is
    refused by name, and out-of-range pages with 400 rather than clamped."""
    params = dict(request.query_params)
    unknown = sorted(set(params) - {"page", "per_page", "status"})
    if unknown:
        raise DomainError(
            Code.UNKNOWN_FIELD, f"unknown query parameter(s): {', '.join(unknown)}", unknown
        )
    page = int(params["page"]) if params.get("page", "").isdigit() else 1
    per_page = int(params["per_page"]) if params.get("per_page", "").isdigit() else 20
    if page < 1 or not 1 <= per_page <= 500:
        raise DomainError(
            Code.INVALID_VALUE, "page >= 1 and per_page in 1..500", ["page", "per_page"]
        )
    return page, per_page, params.get("status")
