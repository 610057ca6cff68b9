"""Credentials: tenants, API keys, system keys (operator, agent) and tenant-user JWTs.

Keys are 32 random bytes, shown once and stored as SHA-256 hashes: with that much entropy a
fast hash is enough (no dictionary to attack), and lookups stay one indexed equality. JWTs are
HS256 only: the algorithm list is pinned when decoding, `exp` is required.

Agent keys are issued per node (`issue_node_credential`): the key acts for that node only, in
the API (reports on tasks placed on it) and on NATS (user `agent-<node_id>`, whose password is
the same key, checked by the embedded server against a bcrypt hash).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

import bcrypt
import jwt

from libs.bus.permissions import nats_user as nats_user
from libs.domain.errors import Code, Conflict, DomainError
from libs.domain.task.model import TenantId
from libs.domain.tenant.events import (
    ApiKeyIssued,
    JoinTokenIssued,
    NodeJoined,
    SystemCredentialIssued,
    TenantCreated,
    TenantUpdated,
)
from libs.store import tenants
from libs.store.eventstore import EventStore

JWT_ALGORITHM = "HS256"
TENANT_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
# Node ids that get credentials: one NATS subject token and consumer name, unescaped.
NODE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")


class Role(StrEnum):
    OPERATOR = "operator"
    AGENT = "agent"
    TENANT_USER = "tenant_user"
    TENANT_KEY = "tenant_key"


@dataclass(frozen=True)
class Principal:
    role: Role
    subject: str
    tenant_id: str | None = None
    # The node an agent key acts for; None for every other role (and for an old, unbound
    # agent key, which may therefore report on nothing).
    node_id: str | None = None

    @property
    def is_tenant(self) -> bool:
        return self.role in (Role.TENANT_USER, Role.TENANT_KEY)

    @property
    def can_report(self) -> bool:
        return self.role in (Role.OPERATOR, Role.AGENT)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key(kind: str) -> str:
    return f"hf_{kind}_{secrets.token_urlsafe(32)}"


async def create_tenant(store: EventStore, tenant_id: str, name: str, gpu_quota: int = 0) -> None:
    if not TENANT_ID_RE.match(tenant_id):
        raise DomainError(
            Code.INVALID_VALUE,
            "id must be 1-63 lowercase letters, digits or '-', starting with a letter or digit",
            ["id"],
        )
    if await tenants.get_tenant(store, tenant_id) is not None:
        raise DomainError(Code.CAS_CONFLICT, f"tenant {tenant_id!r} already exists", ["id"])
    # Names are unique too (a constraint of the tenants table): said here, with the field,
    # rather than met as the constraint's error.
    if (holder := await tenants.tenant_named(store, name)) is not None:
        raise DomainError(
            Code.CAS_CONFLICT, f"tenant {holder!r} already has the name {name!r}", ["name"]
        )
    ev = TenantCreated(tenant_id=TenantId(tenant_id), name=name, gpu_quota=gpu_quota)
    await store.append_stream(f"tenant-{tenant_id}", [ev], expected_version=0)


async def issue_api_key(store: EventStore, tenant_id: str, name: str) -> tuple[str, str]:
    """Return (key_id, key). The key is not stored; only its hash is."""
    key = new_key("tk")
    key_id = "key-" + uuid.uuid4().hex[:16]
    ev = ApiKeyIssued(
        key_id=key_id,
        tenant_id=TenantId(tenant_id),
        name=name,
        prefix=key[:10],
        key_hash=hash_key(key),
    )
    await store.append_stream(f"tenant-{tenant_id}", [ev])
    return key_id, key


async def issue_system_credential(store: EventStore, role: str, name: str) -> str:
    if role not in ("operator", "agent"):
        raise ValueError(role)
    key = new_key("op" if role == "operator" else "ag")
    ev = SystemCredentialIssued(
        credential_id="cred-" + uuid.uuid4().hex[:16],
        role=role,
        name=name,
        prefix=key[:10],
        key_hash=hash_key(key),
    )
    await store.append_stream("system", [ev])
    return key


async def issue_node_credential(store: EventStore, node_id: str) -> str:
    """A new agent key bound to `node_id` (a previous key of that node stops working)."""
    key, ev = _node_credential(node_id)
    await store.append_stream("system", [ev])
    return key


def _node_credential(node_id: str) -> tuple[str, SystemCredentialIssued]:
    if not NODE_ID_RE.match(node_id):
        raise DomainError(
            Code.INVALID_VALUE,
            "node id must be 1-63 letters, digits, '_' or '-', starting with a letter or digit",
            ["node_id"],
        )
    key = new_key("ag")
    ev = SystemCredentialIssued(
        credential_id="cred-" + uuid.uuid4().hex[:16],
        role="agent",
        name=f"node {node_id}",
        prefix=key[:10],
        key_hash=hash_key(key),
        node_id=node_id,
        # Cost 10: checked once per NATS login, not per request.
        nats_password_hash=bcrypt.hashpw(key.encode(), bcrypt.gensalt(10)).decode(),
    )
    return key, ev


async def issue_join_token(
    store: EventStore, ttl: timedelta, now: datetime
) -> tuple[str, datetime]:
    """A one-time token with which one new node registers itself before `now + ttl`."""
    token = new_key("jt")
    token_id = "join-" + uuid.uuid4().hex[:16]
    expires = now + ttl
    ev = JoinTokenIssued(
        token_id=token_id, prefix=token[:10], key_hash=hash_key(token), expires_at=expires
    )
    await store.append_stream(token_id, [ev], expected_version=0)
    return token, expires


async def join_node(store: EventStore, token: str, node_id: str, now: datetime) -> str:
    """Spend a join token on `node_id` and return the node's key.

    The token is spent and the key issued in one append on the token's stream, conditioned
    on the token being unspent (version 1): of two nodes racing with one token, one wins. A
    node that already has a key is not taken over (an operator registers it again instead).
    """
    found = (
        await tenants.find_join_token(store, hash_key(token))
        if token.startswith("hf_jt_")
        else None
    )
    if found is None or found.used_at is not None or found.expires_at <= now:
        raise DomainError(Code.UNAUTHENTICATED, "unknown, spent or expired join token")
    if await tenants.node_credential(store, node_id) is not None:
        raise DomainError(Code.CAS_CONFLICT, f"node {node_id} is already registered", ["node_id"])
    key, ev = _node_credential(node_id)
    try:
        await store.append_stream(
            found.id, [NodeJoined(token_id=found.id, node_id=node_id), ev], expected_version=1
        )
    except Conflict:
        raise DomainError(Code.UNAUTHENTICATED, "unknown, spent or expired join token") from None
    return key


def issue_jwt(
    secret: str,
    tenant_id: str,
    subject: str,
    ttl: timedelta,
    now: datetime,
    issuer: str = "heteroflow",
) -> str:
    claims = {
        "sub": subject,
        "tenant_id": tenant_id,
        "iss": issuer,
        "iat": int(now.timestamp()),
        "exp": int((now + ttl).timestamp()),
    }
    return jwt.encode(claims, secret, algorithm=JWT_ALGORITHM)


def decode_jwt(token: str, secret: str, issuer: str = "heteroflow") -> dict[str, Any]:
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            secret,
            algorithms=[JWT_ALGORITHM],
            issuer=issuer,
            options={"require": ["exp", "sub", "tenant_id"]},
        )
    except jwt.ExpiredSignatureError:
        raise DomainError(Code.UNAUTHENTICATED, "token expired") from None
    except jwt.PyJWTError as exc:
        raise DomainError(Code.UNAUTHENTICATED, f"invalid token: {exc}") from None
    return claims


class CredentialCache:
    """Positive credential and tenant lookups, each kept `ttl_s` seconds (0: no caching).

    A gateway answers every request after a lookup of its key; with the cache a busy caller
    costs one lookup per TTL instead of one per request. Only what was found is kept, so a
    new key or tenant works at once; a revoked key stops working at most `ttl_s` later (on
    each gateway worker, since each holds its own cache). Keys are the SHA-256 digests the
    store holds, never the tokens themselves.
    """

    def __init__(
        self,
        ttl_s: float,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self._entries: dict[str, tuple[float, Any]] = {}

    def get(self, key: str) -> Any:
        found = self._entries.get(key)
        if found is None:
            return None
        if found[0] <= self.clock():
            del self._entries[key]
            return None
        return found[1]

    def put(self, key: str, value: Any) -> None:
        if self.ttl_s <= 0:
            return
        if len(self._entries) >= self.max_entries:
            # Drop the oldest insertion (dicts keep insertion order): a flood of distinct
            # keys cannot grow the cache without bound.
            del self._entries[next(iter(self._entries))]
        self._entries[key] = (self.clock() + self.ttl_s, value)

    def drop(self, key: str) -> None:
        self._entries.pop(key, None)


NO_CACHE = CredentialCache(0)


async def tenant_exists(
    store: EventStore, tenant_id: str, cache: CredentialCache = NO_CACHE
) -> bool:
    """Whether the tenant exists (tenants are never deleted, so a hit may be cached)."""
    key = "tenant:" + tenant_id
    if cache.get(key):
        return True
    found = await tenants.get_tenant(store, tenant_id) is not None
    if found:
        cache.put(key, True)
    return found


async def admit_tenant(
    store: EventStore, tenant_id: str, cache: CredentialCache = NO_CACHE
) -> None:
    """Refuse new work for an unknown tenant (40003) or a suspended one (403). Only an active
    tenant is cached, so a suspension takes effect within the cache TTL on every worker."""
    key = "tenant-active:" + tenant_id
    if cache.get(key):
        return
    tenant = await tenants.get_tenant(store, tenant_id)
    if tenant is None:
        raise DomainError(Code.INVALID_VALUE, f"unknown tenant {tenant_id!r}", ["tenant_id"])
    if tenant.suspended:
        raise DomainError(
            Code.FORBIDDEN,
            f"tenant {tenant_id!r} is suspended: no new tasks, groups or scale-ups",
            ["tenant_id"],
        )
    cache.put(key, True)


def forget_tenant(cache: CredentialCache, tenant_id: str) -> None:
    """Drop this worker's cached admission of a tenant (after its suspension)."""
    cache.drop("tenant-active:" + tenant_id)


async def update_tenant(
    store: EventStore, tenant_id: str, *, suspended: bool | None, gpu_quota: int | None
) -> None:
    ev = TenantUpdated(tenant_id=TenantId(tenant_id), suspended=suspended, gpu_quota=gpu_quota)
    await store.append_stream(f"tenant-{tenant_id}", [ev])


async def authenticate(
    store: EventStore,
    token: str,
    jwt_secret: str | None,
    cache: CredentialCache = NO_CACHE,
) -> Principal:
    """Resolve a bearer token to a principal, or raise 40101."""
    if token.startswith("hf_"):
        digest = hash_key(token)
        principal: Principal | None = cache.get(digest)
        if principal is not None:
            return principal
        found = await tenants.find_credential(store, digest)
        if isinstance(found, tenants.SystemCredential):
            principal = Principal(Role(found.role), found.id, node_id=found.node_id)
        elif isinstance(found, tenants.KeyOwner):
            principal = Principal(Role.TENANT_KEY, found.id, found.tenant_id)
        else:
            raise DomainError(Code.UNAUTHENTICATED, "unknown or revoked key")
        cache.put(digest, principal)
        return principal
    if token.count(".") == 2 and jwt_secret:
        claims = decode_jwt(token, jwt_secret)
        if not await tenant_exists(store, str(claims["tenant_id"]), cache):
            raise DomainError(Code.UNAUTHENTICATED, "token names an unknown tenant")
        return Principal(Role.TENANT_USER, str(claims["sub"]), str(claims["tenant_id"]))
    raise DomainError(Code.UNAUTHENTICATED, "unrecognised bearer token")
