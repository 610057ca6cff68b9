"""Tenants and credentials as the platform reads them: the rows of their projections (the
events are in `events.py`; the store folds them in SQL, `libs/store/projections.py`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class Tenant:
    id: str
    name: str
    gpu_quota: int
    created_at: datetime
    suspended: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ApiKey:
    """A tenant's key as listed to an operator (never its hash)."""

    id: str
    name: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class KeyOwner:
    """Whom a live tenant API key belongs to."""

    id: str
    tenant_id: str
    name: str


@dataclass(frozen=True)
class SystemCredential:
    id: str
    role: str
    name: str
    node_id: str | None = None


@dataclass(frozen=True)
class JoinToken:
    id: str
    expires_at: datetime
    used_at: datetime | None


@dataclass(frozen=True)
class NodeLogin:
    """A node's live agent key as the embedded NATS server checks it (a bcrypt hash)."""

    node_id: str
    nats_password_hash: str
