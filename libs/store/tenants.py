"""Reads of the tenant projections: `tenants`, `api_keys`, `system_credentials` and
`join_tokens` (who may call the API), plus the GPU quotas the scheduler enforces.

Rows are written only by the append path (`projections.apply_other`).
"""

from __future__ import annotations

from libs.domain.tenant.model import (
    ApiKey,
    JoinToken,
    KeyOwner,
    NodeLogin,
    SystemCredential,
    Tenant,
)

from .eventstore import EventStore
from .pool import one, rows


async def get_tenant(store: EventStore, tenant_id: str) -> Tenant | None:
    row = await one(
        store,
        "SELECT id, name, gpu_quota, created_at, suspended FROM tenants WHERE id = %s",
        [tenant_id],
    )
    return Tenant(**row) if row else None


async def tenant_named(store: EventStore, name: str) -> str | None:
    """The id of the tenant with this display name (names are unique), if any."""
    row = await one(store, "SELECT id FROM tenants WHERE name = %s", [name])
    return str(row["id"]) if row else None


async def list_tenants(store: EventStore) -> list[Tenant]:
    found = await rows(
        store, "SELECT id, name, gpu_quota, created_at, suspended FROM tenants ORDER BY id"
    )
    return [Tenant(**r) for r in found]


async def gpu_quotas(store: EventStore) -> dict[str, float]:
    """tenant id → GPU quota, for the tenants that have one."""
    found = await rows(store, "SELECT id, gpu_quota FROM tenants WHERE gpu_quota > 0")
    return {r["id"]: float(r["gpu_quota"]) for r in found}


async def list_api_keys(store: EventStore, tenant_id: str) -> list[ApiKey]:
    found = await rows(
        store,
        "SELECT id, name, prefix, created_at, revoked_at FROM api_keys WHERE tenant_id = %s"
        " ORDER BY created_at",
        [tenant_id],
    )
    return [ApiKey(**r) for r in found]


async def find_credential(store: EventStore, key_hash: str) -> SystemCredential | KeyOwner | None:
    """Who holds a key: a system credential, else a live tenant API key (one round trip)."""
    found = await rows(
        store,
        "SELECT 0 AS rank, id, role, NULL AS tenant_id, name, node_id FROM system_credentials"
        " WHERE key_hash = %s AND revoked_at IS NULL"
        " UNION ALL"
        " SELECT 1, id, NULL, tenant_id, name, NULL FROM api_keys"
        " WHERE key_hash = %s AND revoked_at IS NULL"
        " ORDER BY rank LIMIT 1",
        [key_hash, key_hash],
    )
    if not found:
        return None
    row = found[0]
    if row["rank"] == 0:
        return SystemCredential(row["id"], row["role"], row["name"], row["node_id"])
    return KeyOwner(row["id"], row["tenant_id"], row["name"])


async def has_operator(store: EventStore) -> bool:
    """Whether any operator credential was ever issued (first start bootstraps one)."""
    row = await one(store, "SELECT 1 AS ok FROM system_credentials WHERE role = 'operator' LIMIT 1")
    return row is not None


async def node_logins(store: EventStore) -> list[NodeLogin]:
    """Every node's live agent key that can log in to NATS, by node id."""
    found = await rows(
        store,
        "SELECT node_id, nats_password_hash FROM system_credentials"
        " WHERE node_id IS NOT NULL AND nats_password_hash IS NOT NULL AND revoked_at IS NULL"
        " ORDER BY node_id",
    )
    return [NodeLogin(r["node_id"], r["nats_password_hash"]) for r in found]


async def node_credential(store: EventStore, node_id: str) -> SystemCredential | None:
    """The live agent key of `node_id`, if one was issued."""
    row = await one(
        store,
        "SELECT id, role, name, node_id FROM system_credentials"
        " WHERE node_id = %s AND revoked_at IS NULL",
        [node_id],
    )
    return SystemCredential(row["id"], row["role"], row["name"], row["node_id"]) if row else None


async def find_join_token(store: EventStore, key_hash: str) -> JoinToken | None:
    row = await one(
        store, "SELECT id, expires_at, used_at FROM join_tokens WHERE key_hash = %s", [key_hash]
    )
    return JoinToken(**row) if row else None


__all__ = [
    "ApiKey",
    "JoinToken",
    "KeyOwner",
    "NodeLogin",
    "SystemCredential",
    "Tenant",
]
