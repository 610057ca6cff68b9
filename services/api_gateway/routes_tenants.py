"""`/api/v1/tenants`: operators create tenants, API keys (shown once) and user tokens."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from libs import auth
from libs.domain.errors import Code, DomainError, NotFound
from libs.store import tenants

from .deps import Principal, Store, require_operator
from .schemas import ApiKeyCreate, TenantCreate, TenantUpdate, TokenCreate, body_of

router = APIRouter(prefix="/api/v1/tenants", tags=["tenants"])
CreateBody = Annotated[TenantCreate, Depends(body_of(TenantCreate))]
UpdateBody = Annotated[TenantUpdate, Depends(body_of(TenantUpdate))]
KeyBody = Annotated[ApiKeyCreate, Depends(body_of(ApiKeyCreate))]
TokenBody = Annotated[TokenCreate, Depends(body_of(TokenCreate))]


@router.post("", status_code=201)
async def create_tenant(principal: Principal, store: Store, req: CreateBody) -> dict[str, Any]:
    require_operator(principal)
    await auth.create_tenant(store, req.id, req.name or req.id, req.gpu_quota)
    tenant = await tenants.get_tenant(store, req.id)
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
    request: Request,
    tenant_id: str,
    principal: Principal,
    store: Store,
    req: UpdateBody,
) -> dict[str, Any]:
    """Operators suspend or resume a tenant and change its GPU quota."""
    require_operator(principal)
    await _tenant(store, tenant_id)
    await auth.update_tenant(store, tenant_id, suspended=req.suspended, gpu_quota=req.gpu_quota)
    auth.forget_tenant(request.app.state.auth_cache, tenant_id)
    return await _tenant(store, tenant_id)


@router.post("/{tenant_id}/api-keys", status_code=201)
async def create_api_key(
    tenant_id: str, principal: Principal, store: Store, req: KeyBody
) -> dict[str, Any]:
    require_operator(principal)
    await _tenant(store, tenant_id)
    key_id, key = await auth.issue_api_key(store, tenant_id, req.name)
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
    request: Request,
    tenant_id: str,
    principal: Principal,
    store: Store,
    req: TokenBody,
) -> dict[str, Any]:
    """Mint a tenant-user JWT (HS256, with `exp`) for `subject`."""
    require_operator(principal)
    await _tenant(store, tenant_id)
    ttl = req.ttl_seconds
    secret = request.app.state.settings.jwt_secret
    if secret is None:
        raise DomainError(Code.FORBIDDEN, "tenant-user tokens are disabled (no jwt_secret)")
    token = auth.issue_jwt(
        secret.get_secret_value(),
        tenant_id,
        req.subject,
        timedelta(seconds=ttl),
        store.clock(),
        request.app.state.settings.jwt_issuer,
    )
    return {"token": token, "tenant_id": tenant_id, "expires_in": ttl}
