"""Shedding and fairness: bounded work in flight, per-tenant write rates.

An overloaded gateway must say so at once instead of queueing requests until their callers
give up: a queue that only grows turns every answer late, the cheap ones too.

* `Shedding` (ASGI middleware) counts the requests in flight in two classes, reads (GET,
  HEAD) and writes (everything else), each with its own bound. A request over its class's
  bound is answered 503 with `Retry-After` before any work is done, so creates shed under a
  burst leave the reads their own room. A request leaves the count when its answer starts:
  what costs CPU and database time is the work before the first byte, and a long stream
  (logs followed, an event stream) must not hold a slot for its whole life.
* One tenant may hold at most its share of the write slots (`max_writes_per_tenant`, three
  quarters of them by default, none under 4 slots): past it its writes are 503 while the
  others' still find room. It counts the writes of callers already known to this gateway
  (their key in the credential cache: after a tenant's first request, nearly every one); a
  write holds its slot only once its body is read (limits.py), so slow uploads hold none.
* `TenantRates` is a token bucket per tenant for writes (429 with `Retry-After` beyond
  it), checked once the caller is authenticated, so one tenant's burst cannot take every
  write slot from the others. A caller already known to this gateway (its key in the
  credential cache) whose bucket is empty is refused by `Shedding` too, before routing:
  under a flood of one tenant's creates, most of them are such refusals, and taking them
  through the whole application is what slowed every other answer down.

* A gateway given a `DiskSpace` (libs/diskspace.py) answers every write 503 (code 50302,
  nothing written) with `Retry-After` while free space under `HETEROFLOW_HOME` is below its
  threshold: a full disk breaks the embedded servers' stores, so writes stop a little before.

Both are per gateway process: with `HETEROFLOW_GATEWAY_WORKERS=N` the platform admits N times
the bounds. Health and metrics endpoints are never shed, nor is inference traffic on `/serve/`
(the router bounds its own queue).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from libs import auth
from libs.diskspace import RETRY_AFTER_S as DISK_RETRY_AFTER_S
from libs.diskspace import DiskSpace
from libs.domain.errors import Code, Throttled
from libs.store.pool import WAIT_TIMEOUT_S

from .responses import FastJSONResponse

SHED = Counter(
    "heteroflow_gateway_shed_total",
    "Requests refused for load before any work: 503 (in flight) or 429 (tenant rate)",
    ["kind", "reason"],
)

IN_FLIGHT = Gauge(
    "heteroflow_gateway_in_flight",
    "Requests of this gateway process between arrival and the start of their answer",
    ["kind"],
)

READ_METHODS = frozenset({"GET", "HEAD"})
NEVER_SHED = frozenset({"/healthz", "/readyz", "/metrics"})
# Inference traffic through the router has its own bounded wait queue (serving.py) and may
# hold a request for as long as a model generates: the API's bounds would starve it.
ROUTED_PREFIX = "/serve/"
RETRY_AFTER_S = 1


class Shedding:
    """Answer 503 at once when a class of requests already has its bound in flight."""

    def __init__(
        self,
        app: ASGIApp,
        max_reads: int,
        max_writes: int,
        db_wait_s: float,
        rates: TenantRates | None = None,
        credentials: auth.CredentialCache | None = None,
        disk: DiskSpace | None = None,
        max_writes_per_tenant: int = 0,
    ) -> None:
        """`rates` and `credentials`: the application's tenant buckets and credential cache,
        for the early 429 (without them, only the dependency checks the rate); `disk`: the
        free space that sheds writes below its threshold; `max_writes_per_tenant`: one known
        tenant's share of the write bound (0: three quarters of it; none under 4)."""
        self.app = app
        self.db_wait_s = db_wait_s
        self.bounds = {"read": max_reads, "write": max_writes}
        self.in_flight = {"read": 0, "write": 0}
        self.rates = rates
        self.credentials = credentials
        self.disk = disk
        # Under 4 slots a share would leave a tenant too little to be of use: none then.
        default_share = max_writes * 3 // 4 if max_writes >= 4 else 0
        self.tenant_share = max_writes_per_tenant or default_share
        self.tenant_writes: dict[str, int] = {}

    def _known_tenant(self, scope: Scope) -> str | None:
        """The tenant of a cached API key in the request's Authorization header, or None
        (anything not already known goes the whole way and is authenticated there)."""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                token = token.strip()
                if scheme.lower() != "bearer" or not token.startswith("hf_"):
                    return None
                assert self.credentials is not None
                principal = self.credentials.get(auth.hash_key(token))
                known = isinstance(principal, auth.Principal) and principal.is_tenant
                return principal.tenant_id if known else None
        return None

    async def _over_share(self, tenant: str, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answer 503 when `tenant` already holds its share of the write slots."""
        held = self.tenant_writes.get(tenant, 0)
        if not self.tenant_share or held < self.tenant_share:
            return False
        SHED.labels("write", "tenant_share").inc()
        message = (
            f"tenant {tenant} has {held} writes in flight, its share of this gateway's "
            f"{self.bounds['write']}; retry after {RETRY_AFTER_S} s"
        )
        answer = FastJSONResponse(
            {"error": message, "code": int(Code.OVERLOADED)},
            503,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
        await answer(scope, receive, send)
        return True

    async def _over_rate(
        self, tenant: str | None, scope: Scope, receive: Receive, send: Send
    ) -> bool:
        """Answer the 429 the rate dependency would give, at once; False to go on."""
        if self.rates is None or tenant is None or self.rates.rate <= 0:
            return False
        try:
            self.rates.check(tenant)
        except Throttled as exc:
            answer = FastJSONResponse(
                {"error": exc.message, "code": int(exc.code)},
                exc.http_status,
                headers={"Retry-After": str(exc.retry_after_s)},
            )
            await answer(scope, receive, send)
            return True
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in NEVER_SHED or path.startswith(ROUTED_PREFIX):
            await self.app(scope, receive, send)
            return
        kind = "read" if scope.get("method", "GET") in READ_METHODS else "write"
        bound = self.bounds[kind]
        if bound and self.in_flight[kind] >= bound:
            SHED.labels(kind, "in_flight").inc()
            message = f"the gateway has {bound} {kind}s in flight; retry after {RETRY_AFTER_S} s"
            answer = FastJSONResponse(
                {"error": message, "code": int(Code.OVERLOADED)},
                503,
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
            await answer(scope, receive, send)
            return
        if kind == "write" and self.disk is not None and (low := self.disk.cause()):
            SHED.labels(kind, "disk_space").inc()
            answer = FastJSONResponse(
                {
                    "error": f"{low}: writes are refused; retry after {DISK_RETRY_AFTER_S} s",
                    "code": int(Code.STORE_UNAVAILABLE),
                },
                503,
                headers={"Retry-After": str(DISK_RETRY_AFTER_S)},
            )
            await answer(scope, receive, send)
            return
        known = kind == "write" and self.credentials is not None
        tenant = self._known_tenant(scope) if known else None
        if tenant is not None and await self._over_share(tenant, scope, receive, send):
            return
        if kind == "write" and await self._over_rate(tenant, scope, receive, send):
            return
        self.in_flight[kind] += 1
        IN_FLIGHT.labels(kind).inc()
        if tenant is not None:
            self.tenant_writes[tenant] = self.tenant_writes.get(tenant, 0) + 1
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self.in_flight[kind] -= 1
                IN_FLIGHT.labels(kind).dec()
                if tenant is not None:
                    left = self.tenant_writes[tenant] - 1
                    if left:
                        self.tenant_writes[tenant] = left
                    else:
                        del self.tenant_writes[tenant]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                release()
            await send(message)

        waits = WAIT_TIMEOUT_S.set(self.db_wait_s)
        try:
            await self.app(scope, receive, sending)
        finally:
            WAIT_TIMEOUT_S.reset(waits)
            release()


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class TenantRates:
    """A token bucket per tenant: `rate` tokens a second, at most `burst` saved up."""

    rate: float
    burst: int
    clock: Callable[[], float] = time.monotonic
    buckets: dict[str, _Bucket] = field(default_factory=dict)

    def take(self, tenant: str) -> None:
        """Spend one token of `tenant`'s bucket, or raise `Throttled` (429) naming the rate."""
        if self.rate <= 0:
            return
        bucket = self.check(tenant)
        bucket.tokens -= 1.0

    def check(self, tenant: str) -> _Bucket:
        """`tenant`'s bucket refilled to now, spending nothing; `Throttled` (429) when it
        holds less than a token."""
        now = self.clock()
        bucket = self.buckets.get(tenant)
        if bucket is None:
            bucket = self.buckets[tenant] = _Bucket(float(self.burst), now)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.at) * self.rate)
        bucket.at = now
        if bucket.tokens >= 1.0:
            return bucket
        SHED.labels("write", "tenant_rate").inc()
        wait = max(1, math.ceil((1.0 - bucket.tokens) / self.rate))
        raise Throttled(
            Code.TOO_MANY_REQUESTS,
            f"tenant {tenant} is over its write rate of {self.rate:g}/s "
            f"(burst {self.burst}); retry after {wait} s",
            wait,
        )
