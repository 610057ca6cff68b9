"""`/api/v1/tenants`: operators create tenants, API keys (shown once) and user tokens."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Request

from libs import auth
from libs.domain.errors import Code, DomainError, NotFound
from libs.store import tenants

from .deps import Body, Principal, Store, require_operator

router = APIRouter(prefix="/api/v1/tenants", tags=["tenants"])


def _fields(body: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise DomainError(Code.UNKNOWN_FIELD, f"unknown field(s): {', '.join(unknown)}", unknown)


def _str(body: dict[str, Any], name: str, default: str | None = None) -> str:
    value = body.get(name, default)
    if not isinstance(value, str) or not value.strip() or len(value) > 100:
        raise DomainError(Code.INVALID_VALUE, f"{name} must be a string of 1-100 chars", [name])
    return value


@router.post("", status_code=201)
async def create_tenant(principal: Principal, store: Store, body: Body) -> dict[str, Any]:
    require_operator(principal)
    _fields(body, {"id", "name", "gpu_quota"})
    tenant_id = _str(body, "id")
    quota = body.get("gpu_quota", 0)
    if isinstance(quota, bool) or not isinstance(quota, int) or quota < 0:
        raise DomainError(Code.INVALID_VALUE, "gpu_quota must be an integer >= 0", ["gpu_quota"])
    await auth.create_tenant(store, tenant_id, _str(body, "name", tenant_id), quota)
    tenant = await tenants.get_tenant(store, tenant_id)
    assert tenant is not None
    return tenant.as_dict()


@router.get("")
async def list_tenants(principal: Principal, store: Store) -> dict[str, Any]:
    require_operator(principal)
    return {"tenants": [t.as_dict() for t in await tenants.list_tenants(store)]}


async def _tenant(store: Store, tenant_id: str) -> dict[str, Any]:
    tenant = await tenants.get_tenant(store, tenant_id)
    if tenant is None:
        raise NotFound("tenant")
    return tenant.as_dict()


@router.put("/{tenant_id}")
async def update_tenant(
    request: Request, tenant_id: str, principal: Principal, store: Store, body: Body
) -> dict[str, Any]:
    """Operators suspend or resume a tenant and change its GPU quota."""
    require_operator(principal)
    _fields(body, {"suspended", "gpu_quota"})
    await _tenant(store, tenant_id)
    suspended = body.get("suspended")
    if suspended is not None and not isinstance(suspended, bool):
        raise DomainError(Code.INVALID_VALUE, "suspended must be true or false", ["suspended"])
    quota = body.get("gpu_quota")
    if quota is not None and (isinstance(quota, bool) or not isinstance(quota, int) or quota < 0):
        raise DomainError(Code.INVALID_VALUE, "gpu_quota must be an integer >= 0", ["gpu_quota"])
    await auth.update_tenant(store, tenant_id, suspended=suspended, gpu_quota=quota)
    auth.forget_tenant(request.app.state.auth_cache, tenant_id)
    return await _tenant(store, tenant_id)


@router.post("/{tenant_id}/api-keys", status_code=201)
async def create_api_key(
    tenant_id: str, principal: Principal, store: Store, body: Body
) -> dict[str, Any]:
    require_operator(principal)
    _fields(body, {"name"})
    await _tenant(store, tenant_id)
    key_id, key = await auth.issue_api_key(store, tenant_id, _str(body, "name", "api-key"))
    return {
        "id": key_id,
        "tenant_id": tenant_id,
        "key": key,
        "note": "shown once: only a hash is stored",
    }


@router.get("/{tenant_id}/api-keys")
async def list_api_keys(tenant_id: str, principal: Principal, store: Store) -> dict[str, Any]:
    require_operator(principal)
    await _tenant(store, tenant_id)
    return {"api_keys": [k.as_dict() for k in await tenants.list_api_keys(store, tenant_id)]}


@router.post("/{tenant_id}/tokens", status_code=201)
async def create_user_token(
    request: Request, tenant_id: str, principal: Principal, store: Store, body: Body
) -> dict[str, Any]:
    """Mint a tenant-user JWT (HS256, with `exp`) for `subject`."""
    require_operator(principal)
    _fields(body, {"subject", "ttl_seconds"})
    await _tenant(store, tenant_id)
    ttl = body.get("ttl_seconds", 3600)
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 60 <= ttl <= 30 * 86400:
        raise DomainError(Code.INVALID_VALUE, "ttl_seconds must be 60..2592000", ["ttl_seconds"])
    secret = request.app.state.settings.jwt_secret
    if secret is None:
        raise DomainError(Code.FORBIDDEN, "tenant-user tokens are disabled (no jwt_secret)")
    token = auth.issue_jwt(
        secret.get_secret_value(),
        tenant_id,
        _str(body, "subject"),
        timedelta(seconds=ttl),
        store.clock(),
        request.app.state.settings.jwt_issuer,
    )
    return {"token": token, "tenant_id": tenant_id, "expires_in": ttl}
