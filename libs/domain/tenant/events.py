"""Tenant, credential and join events (streams `tenant-<id>`, `system`)."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar, Literal

from libs.domain.payload import Payload, register
from libs.domain.task.model import TenantId

# --- tenants and credentials -------------------------------------------------------------


class TenantCreated(Payload):
    """A tenant, with its GPU quota (0 = unlimited)."""

    type: ClassVar[str] = "tenant_created"
    stream_type: ClassVar[str] = "tenant"

    tenant_id: TenantId
    name: str
    gpu_quota: int = 0  # 0 = unlimited


class TenantUpdated(Payload):
    """An operator changed a tenant: `suspended` stops new work and scale-ups; `gpu_quota`
    (0 = unlimited). A field left None is unchanged."""

    type: ClassVar[str] = "tenant_updated"
    stream_type: ClassVar[str] = "tenant"

    tenant_id: TenantId
    suspended: bool | None = None
    gpu_quota: int | None = None


class ApiKeyIssued(Payload):
    """A tenant API key; only its SHA-256 hash and prefix are recorded."""

    type: ClassVar[str] = "api_key_issued"
    stream_type: ClassVar[str] = "tenant"

    key_id: str
    tenant_id: TenantId
    name: str
    prefix: str
    key_hash: str


class ApiKeyRevoked(Payload):
    """A tenant API key stops working."""

    type: ClassVar[str] = "api_key_revoked"
    stream_type: ClassVar[str] = "tenant"

    key_id: str
    tenant_id: TenantId


class SystemCredentialIssued(Payload):
    """An operator token or an agent key (stored as a hash, like tenant keys).

    An agent key issued for a node carries `node_id` (it acts for that node only, and a newer
    key for the same node revokes it) and `nats_password_hash`, the bcrypt hash of the same
    key, which the embedded NATS server checks when the agent logs in as `agent-<node_id>`.
    Older agent keys have neither and can do nothing in the API.
    """

    type: ClassVar[str] = "system_credential_issued"
    stream_type: ClassVar[str] = "system"

    credential_id: str
    role: Literal["operator", "agent"]
    name: str
    prefix: str
    key_hash: str
    node_id: str | None = None
    nats_password_hash: str | None = None


class JoinTokenIssued(Payload):
    """A one-time token with which one new node may register itself (stored as a hash)."""

    type: ClassVar[str] = "join_token_issued"
    stream_type: ClassVar[str] = "join"

    token_id: str
    prefix: str
    key_hash: str
    expires_at: datetime


class NodeJoined(Payload):
    """A join token was spent by `node_id`; that node's key is issued in the same append."""

    type: ClassVar[str] = "node_joined"
    stream_type: ClassVar[str] = "join"

    token_id: str
    node_id: str


register(
    TenantCreated,
    TenantUpdated,
    ApiKeyIssued,
    ApiKeyRevoked,
    SystemCredentialIssued,
    JoinTokenIssued,
    NodeJoined,
)
