"""Error codes of SPEC §2 and the domain's own error hierarchy.

Adapters translate infrastructure errors into these at their edge; the gateway turns them
into `{"error", "code", "fields"}` responses with the HTTP status carried here.
"""

from __future__ import annotations

from enum import IntEnum


class Code(IntEnum):
    UNKNOWN_FIELD = 40001
    SERVER_OWNED_FIELD = 40002
    INVALID_VALUE = 40003
    NOT_PENDING = 40020
    INVALID_STATUS_FOR_OPERATION = 40030
    ILLEGAL_TRANSITION = 40040
    UNAUTHENTICATED = 40101
    FORBIDDEN = 40301
    NOT_FOUND = 40401
    CAS_CONFLICT = 40901
    # Serving (docs/serving.md); not in SPEC §2's table either.
    NOT_SERVING = 40902
    # Not in SPEC §2's table, which has no code for these statuses (docs/api.md lists them).
    REQUEST_TIMEOUT = 40801
    PAYLOAD_TOO_LARGE = 41301
    UNSUPPORTED_MEDIA_TYPE = 41501
    TOO_MANY_REQUESTS = 42901
    # SPEC §2's 50001 (scheduling failure) has no member: placement is asynchronous (SPEC
    # §3), so no request waits on it; work that cannot be placed is accepted and stays
    # `pending` with the reason (`pool_capacity`, `queue_quota_exceeded`, ...). docs/api.md.
    # Seed 002: node unreachable is HTTP 500, as its code says (HTTP status × 100 + n).
    NODE_UNREACHABLE = 50002
    OVERLOADED = 50301
    STORE_UNAVAILABLE = 50302
    UPSTREAM_FAILED = 50201
    SERVE_UNAVAILABLE = 50303
    UPSTREAM_TIMEOUT = 50401


HTTP_STATUS: dict[Code, int] = {
    Code.UNKNOWN_FIELD: 400,
    Code.SERVER_OWNED_FIELD: 400,
    Code.INVALID_VALUE: 400,
    Code.NOT_PENDING: 400,
    Code.INVALID_STATUS_FOR_OPERATION: 400,
    Code.ILLEGAL_TRANSITION: 400,
    Code.UNAUTHENTICATED: 401,
    Code.FORBIDDEN: 403,
    Code.NOT_FOUND: 404,
    Code.CAS_CONFLICT: 409,
    Code.NOT_SERVING: 409,
    Code.REQUEST_TIMEOUT: 408,
    Code.PAYLOAD_TOO_LARGE: 413,
    Code.UNSUPPORTED_MEDIA_TYPE: 415,
    Code.TOO_MANY_REQUESTS: 429,
    Code.NODE_UNREACHABLE: 500,
    Code.OVERLOADED: 503,
    Code.STORE_UNAVAILABLE: 503,
    Code.UPSTREAM_FAILED: 502,
    Code.SERVE_UNAVAILABLE: 503,
    Code.UPSTREAM_TIMEOUT: 504,
}


class DomainError(Exception):
    """An error a caller can act on: a code, a message and the fields at fault."""

    def __init__(self, code: Code, message: str, fields: list[str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.fields = fields or []

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]


class Throttled(DomainError):
    """Refused for load, not for what was asked: the same request may succeed after
    `retry_after_s` (sent as `Retry-After`). Nothing was written."""

    def __init__(self, code: Code, message: str, retry_after_s: int) -> None:
        super().__init__(code, message)
        self.retry_after_s = retry_after_s


class NotFound(DomainError):
    def __init__(self, what: str = "task") -> None:
        super().__init__(Code.NOT_FOUND, f"{what} not found")


class Conflict(DomainError):
    """The compare-and-set missed: the row moved under us. Nothing was written."""

    def __init__(self, message: str) -> None:
        super().__init__(Code.CAS_CONFLICT, message)


class StoreError(Exception):
    """The store failed for a reason of its own (not the caller's): translated from the
    database driver at the store's edge, so no service depends on the driver's exceptions.
    Not a `DomainError`: the gateway answers it as any internal failure, unchanged."""


class StoreUnavailable(StoreError):
    """The database cannot be reached or no connection came free in time; a retry may work."""


class Fenced(DomainError):
    """A leader's write carried a fencing token older than the newest the store has seen for
    its lease: another holder took over. Nothing was written; the writer must stop acting."""

    def __init__(self, lease: str, token: int, newest: int) -> None:
        super().__init__(
            Code.CAS_CONFLICT,
            f"lease {lease}: token {token} is fenced off by token {newest}; nothing was changed",
        )
        self.lease = lease
        self.token = token
        self.newest = newest
