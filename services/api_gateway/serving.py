"""The serving router's state: targets, their replicas and readiness, the request figures,
and the wake on request (docs/serving.md).

A target is an inference group (`grp-…`) or a single task that declares `serving`. The
router learns a target on its first request, then a background loop per target re-reads its
members from the store, probes each running replica's `health_path` (ready only after a
2xx) and publishes the target's figures on the bus. The router routes and measures; it
decides nothing on its own: idle sleep is the autoscaler's idle-sleep controller, judged
from these figures (services/autoscaler/controllers/idle_sleep.py), and the wake a request
asks for is one transaction of the pure `decide_wake` (libs/domain/group/serving_control.py).
The proxying itself is the data path's (dataplane/), or routes_serve.py's with
`HETEROFLOW_SERVE_DATAPLANE=false`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from prometheus_client import Counter, Gauge

from libs.bus.subjects import EVENTS_PREFIX, parse_event_subject, serving_metrics_subject
from libs.config import GatewaySettings
from libs.domain.envelope import EventEnvelope
from libs.domain.errors import Code, DomainError, NotFound
from libs.domain.group.serving import Replica, RequestWindow, ServingMetrics, ServingSpec, pick
from libs.domain.group.serving_control import decide_wake, serving_replicas
from libs.domain.reasons import ReasonCode
from libs.domain.task.events import TaskStatusChanged
from libs.domain.task.model import Task
from libs.domain.task.states import TERMINAL, Actor, TaskStatus
from libs.store import groups as group_rows
from libs.store import tasks as task_rows
from libs.store.eventstore import EventStore

log = structlog.get_logger(__name__)
S = TaskStatus

SERVE_REQUESTS = Counter(
    "heteroflow_serve_requests_total", "Requests through /serve/", ["target", "status"]
)
SERVE_RPS = Gauge("heteroflow_serve_requests_per_second", "Requests/s over the window", ["target"])
SERVE_CONCURRENT = Gauge(
    "heteroflow_serve_concurrent_requests", "Requests being proxied now", ["target"]
)
SERVE_P95 = Gauge("heteroflow_serve_latency_p95_seconds", "Latency p95 over the window", ["target"])
SERVE_QUEUED = Gauge(
    "heteroflow_serve_queued_requests", "Requests held for a ready replica", ["target"]
)
SERVE_READY = Gauge("heteroflow_serve_ready_replicas", "Replicas passing health", ["target"])
# A request after this long without one is published at once, not at the next interval:
# the idle-sleep controller must not take a target that has just been asked for as idle.
ANNOUNCE_AFTER_S = 1.0
# Retry-After of a request shed at the cap of requests in flight (`admit`).
SHED_RETRY_AFTER_S = 1


class ServeUnavailable(DomainError):
    """No ready replica within the bounded wait, or the wait queue is full: 503 + Retry-After."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(Code.SERVE_UNAVAILABLE, message)
        self.retry_after_s = retry_after_s


@dataclass
class Target:
    id: str
    tenant_id: str
    serving: ServingSpec | None
    idle_timeout_minutes: int
    members: list[Task]
    window: RequestWindow
    replicas: dict[str, Replica] = field(default_factory=dict)
    # The last request's start or end here, or when this router began watching the target.
    last_activity: float = field(default_factory=time.monotonic)
    announced: float = float("-inf")  # the `last_activity` of the last figures published
    loop: asyncio.Task[None] | None = None
    waking: bool = False
    # Resolved at the next `changed()`: what requests waiting for a replica wait on.
    _next_change: asyncio.Future[None] | None = None

    def changed(self) -> None:
        """Wake the requests waiting for a replica: the replicas were read again."""
        if self._next_change is not None and not self._next_change.done():
            self._next_change.set_result(None)
        self._next_change = None

    async def next_change(self, within_s: float) -> None:
        """Until the next `changed()`, at most `within_s`. Edge-triggered: a change before
        the call does not count, so a waiter whose pick still finds nothing waits again
        rather than spinning (a wait on a level, an Event left set, returns without
        yielding to the loop, and the loop then serves nothing else)."""
        if self._next_change is None:
            self._next_change = asyncio.get_running_loop().create_future()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._next_change), within_s)

    @property
    def statuses(self) -> list[TaskStatus]:
        return [m.status for m in self.members]

    def ready(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.ready and not r.draining]


class ServingRouter:
    """Per gateway process: what it knows of every target it has been asked for."""

    def __init__(
        self, store: EventStore, settings: GatewaySettings, nc: Client | None = None
    ) -> None:
        self.store = store
        self.settings = settings
        self.nc = nc
        self.gateway = f"{socket.gethostname()}:{os.getpid()}"
        self.targets: dict[str, Target] = {}
        self._announcing: set[asyncio.Task[None]] = set()
        self._refreshing: set[asyncio.Task[None]] = set()
        self.clock: Callable[[], float] = time.monotonic
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=200)
        timeout = httpx.Timeout(settings.serve_upstream_timeout_s, connect=5.0)
        self.client = httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False)
        self._probe = httpx.AsyncClient(timeout=2.0, trust_env=False)

    async def close(self) -> None:
        for t in self.targets.values():
            if t.loop:
                t.loop.cancel()
        for job in [*self._announcing, *self._refreshing]:
            job.cancel()
        await self.client.aclose()
        await self._probe.aclose()

    # --- targets -----------------------------------------------------------------------

    async def _load(self, target_id: str) -> tuple[str, ServingSpec | None, int, list[Task]]:
        if target_id.startswith("grp-"):
            group = await group_rows.get(self.store, target_id)
            if group is None:
                raise NotFound("serving target")
            tasks = await task_rows.of_group(self.store, target_id, include_deleted=False)
            spec = group.spec.template
            return group.tenant_id, spec.serving, spec.idle_timeout_minutes, serving_replicas(tasks)
        try:
            task = await self.store.get_task(target_id)
        except NotFound:
            raise NotFound("serving target") from None
        return task.tenant_id, task.spec.serving, task.spec.idle_timeout_minutes, [task]

    async def target(self, target_id: str, tenant: str | None) -> Target:
        """The target, learnt on first use; 404 for another tenant's, 409 when not serving."""
        t = self.targets.get(target_id)
        if t is None:
            tenant_id, serving, idle, members = await self._load(target_id)
            t = Target(
                target_id,
                tenant_id,
                serving,
                idle,
                members,
                RequestWindow(self.settings.serve_window_s),
            )
            if tenant is not None and tenant != tenant_id:
                raise NotFound("serving target")
            if serving is not None:
                t = self.targets.setdefault(target_id, t)
                if t.loop is None:
                    t.loop = asyncio.create_task(self._watch(t))
                    await self._refresh(t)
                    self._announce(t)  # watched from now: not idle since before
        if tenant is not None and tenant != t.tenant_id:
            raise NotFound("serving target")
        if t.serving is None:
            raise DomainError(
                Code.NOT_SERVING,
                f"{target_id} declares no serving port: add serving: {{port, health_path}} "
                "to an inference task or group",
            )
        if t.members and all(m.status in TERMINAL for m in t.members):
            raise DomainError(
                Code.NOT_SERVING,
                f"{target_id} is not serving: every replica has ended "
                f"({', '.join(sorted({m.status.value for m in t.members}))})",
            )
        return t

    async def _refresh(self, t: Target) -> None:
        _, _, t.idle_timeout_minutes, t.members = await self._load(t.id)
        running = {m.id: m for m in t.members if m.status is S.RUNNING and m.serve_address}
        for gone in set(t.replicas) - set(running):
            del t.replicas[gone]
        for tid, m in running.items():
            known = t.replicas.get(tid)
            if known is None or known.address != m.serve_address:
                t.replicas[tid] = Replica(tid, m.serve_address)
            # Kept while draining so its in-flight requests stay counted (docs/rollout.md).
            t.replicas[tid].draining = m.draining
        await asyncio.gather(*(self._check(t, r) for r in list(t.replicas.values())))
        if t.ready():
            t.waking = False
            t.changed()

    async def _refresh_soon(self, t: Target) -> None:
        try:
            await self._refresh(t)
        except NotFound:
            pass  # deleted: the watch forgets it
        except Exception:  # the watch reads it again within a probe interval
            log.exception("serving_refresh_failed", target=t.id)

    async def _check(self, t: Target, r: Replica) -> None:
        assert t.serving is not None
        try:
            resp = await self._probe.get(f"http://{r.address}{t.serving.health_path}")
            ok, why = 200 <= resp.status_code < 300, f"health answered {resp.status_code}"
        except httpx.HTTPError as exc:
            ok, why = False, f"health check failed: {type(exc).__name__}"
        if ok != r.ready:
            log.info("replica_readiness", target=t.id, task_id=r.task_id, ready=ok, why=why)
        r.ready, r.last_error = ok, "" if ok else why

    async def _watch(self, t: Target) -> None:
        """Refresh and probe every probe interval, while the target lives; export and
        publish the figures every metrics interval."""
        published = self.clock()
        while True:
            await asyncio.sleep(self.settings.serve_probe_interval_s)
            try:
                await self._refresh(t)
                if t.members and all(m.status in TERMINAL for m in t.members):
                    t.changed()
                    if not (t.window.concurrent or t.window.queued):
                        self._forget(t)  # ended: a later request learns it afresh
                        return
                if self.clock() - published >= self.settings.serve_metrics_interval_s:
                    published = self.clock()
                    await self.publish(t)
            except asyncio.CancelledError:
                raise
            except NotFound:  # deleted
                self._forget(t)
                return
            except Exception:  # a store hiccup must not end the watch
                log.exception("serving_watch_failed", target=t.id)

    def _forget(self, t: Target) -> None:
        if self.targets.get(t.id) is t:
            del self.targets[t.id]
        for gauge in (SERVE_RPS, SERVE_CONCURRENT, SERVE_P95, SERVE_QUEUED, SERVE_READY):
            with contextlib.suppress(KeyError):
                gauge.remove(t.id)

    def metrics(self, t: Target) -> ServingMetrics:
        now = self.clock()
        f = t.window.figures(now)
        return ServingMetrics(
            target_id=t.id,
            tenant_id=t.tenant_id,
            gateway=self.gateway,
            requests_per_second=f["requests_per_second"],
            concurrent_requests=int(f["concurrent_requests"]),
            latency_p95_ms=f["latency_p95_ms"],
            queued_requests=int(f["queued_requests"]),
            replicas=len(t.members),
            ready_replicas=len(t.ready()),
            idle_s=max(0.0, now - t.last_activity),
            at=datetime.now(UTC),
            outstanding={r.task_id: r.outstanding for r in t.replicas.values() if r.outstanding},
            draining=sorted(r.task_id for r in t.replicas.values() if r.draining),
        )

    async def publish(self, t: Target) -> None:
        """Export the figures at /metrics and publish them on the bus."""
        m = self.metrics(t)
        t.announced = t.last_activity
        SERVE_RPS.labels(t.id).set(m.requests_per_second)
        SERVE_CONCURRENT.labels(t.id).set(m.concurrent_requests)
        SERVE_P95.labels(t.id).set(m.latency_p95_ms / 1000)
        SERVE_QUEUED.labels(t.id).set(m.queued_requests)
        SERVE_READY.labels(t.id).set(m.ready_replicas)
        if self.nc is not None and self.nc.is_connected:
            await self.nc.publish(serving_metrics_subject(t.id), m.model_dump_json().encode())

    def _announce(self, t: Target, quiet_s: float = math.inf) -> None:
        """Publish now when a request ends a quiet spell (`quiet_s` since the one before)
        and the figures last published are older than that. Under steady load requests
        are never a second apart, and the figures go out at the metrics interval only."""
        if quiet_s < ANNOUNCE_AFTER_S or t.last_activity - t.announced < ANNOUNCE_AFTER_S:
            return
        job = asyncio.create_task(self.publish(t))
        self._announcing.add(job)
        job.add_done_callback(self._announcing.discard)

    async def adopt(self) -> None:
        """Watch every serving target with an idle timeout, not only those asked for since
        this process started (so one nobody calls after a restart still goes to sleep)."""
        for target_id in await task_rows.serving_targets(self.store):
            if target_id not in self.targets:
                with contextlib.suppress(DomainError):
                    await self.target(target_id, None)

    async def run(self, stop: asyncio.Event) -> None:
        """The background part: adopt targets now and then, and hear replicas leave."""
        sub = None
        if self.nc is not None:
            subject = f"{EVENTS_PREFIX}.task.*.{TaskStatusChanged.type}"
            sub = await self.nc.subscribe(subject, cb=self.on_status_changed)
        try:
            while not stop.is_set():
                try:
                    await self.adopt()
                except Exception:  # the next round tries again
                    log.exception("serving_adopt_failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.settings.serve_adopt_interval_s)
        finally:
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    async def on_status_changed(self, msg: Msg) -> None:
        """A replica that leaves `running` is routed to no more at once, and its target read
        again. The watch would see it within a probe interval, but a request meanwhile would
        reach an engine just put to sleep (by the idle-sleep controller, another gateway or a
        user) or stopping. Only the subject is read for tasks this router does not route to."""
        try:
            task_id = parse_event_subject(msg.subject).stream_id
        except ValueError:
            return
        watching = [t for t in self.targets.values() if task_id in t.replicas]
        if not watching:
            return
        try:
            envelope = EventEnvelope.model_validate_json(msg.data)
            ev = TaskStatusChanged.model_validate(envelope.payload)
        except ValueError:
            log.warning("serving_status_unreadable", subject=msg.subject)
            return
        if ev.to_status is S.RUNNING:
            return
        for t in watching:
            t.replicas.pop(task_id, None)
            job = asyncio.create_task(self._refresh_soon(t))
            self._refreshing.add(job)
            job.add_done_callback(self._refreshing.discard)

    # --- wake on request ---------------------------------------------------------------

    async def wake(self, t: Target) -> None:
        """Lazy wake (SPEC §2): sleeping members go `waking`, or back to `pending` when their
        host is offline (rescheduled elsewhere), each decided on its host's status read in
        the transaction of the wake; the caller waits for a ready replica."""
        sleeping = [m for m in t.members if m.status is S.SLEEPING]
        if not sleeping:
            return
        t.waking = True
        decisions: dict[str, task_rows.HostDecide] = {
            m.id: lambda task, online: decide_wake(
                task, online, Actor.CONTROLLER, ReasonCode.REQUEST_WAKE
            )
            for m in sleeping
        }
        done, refused = await task_rows.execute_batch_by_host(
            self.store, decisions, metadata={"principal": "serving-router"}
        )
        log.info("serving_request_wake", target=t.id, tasks=sorted(done), refused=len(refused))

    # --- requests ------------------------------------------------------------------------

    def admit(self, t: Target) -> None:
        """Shed a request past the target's cap of requests in flight at this gateway worker
        (HETEROFLOW_SERVE_MAX_OUTSTANDING): 503 + Retry-After before latency runs away."""
        cap = self.settings.serve_max_outstanding
        if cap and t.window.concurrent >= cap:
            raise ServeUnavailable(
                f"{t.id}: {t.window.concurrent} requests already in flight at this gateway "
                f"worker (HETEROFLOW_SERVE_MAX_OUTSTANDING={cap})",
                SHED_RETRY_AFTER_S,
            )

    async def acquire(self, t: Target, exclude: set[str]) -> Replica:
        """A ready replica (least outstanding), waiting a bounded time in a bounded queue."""
        now = self.clock()
        quiet_s = now - t.last_activity
        t.last_activity = now
        t.window.started(now)
        self._announce(t, quiet_s)
        replica = pick(t.replicas.values(), exclude)
        if replica is not None:
            return replica
        wait_s = self.settings.serve_wait_s
        retry_after = max(1, round(wait_s))
        if t.window.queued >= self.settings.serve_queue_max:
            raise ServeUnavailable(
                f"{t.id}: {t.window.queued} requests already wait for a ready replica",
                retry_after,
            )
        t.window.queued += 1
        try:
            deadline = self.clock() + wait_s
            while (replica := pick(t.replicas.values(), exclude)) is None:
                if any(m.status is S.SLEEPING for m in t.members) and not t.waking:
                    # Shielded: a client that leaves (its request cancelled) must not cut
                    # the wake short and leave `waking` set on a target nobody wakes.
                    await asyncio.shield(self.wake(t))
                    continue  # pick again: the replicas may have changed meanwhile
                left = deadline - self.clock()
                if left <= 0:
                    raise ServeUnavailable(
                        f"{t.id}: no ready replica within {wait_s:g}s "
                        f"(replica statuses: {', '.join(s.value for s in t.statuses) or 'none'})",
                        retry_after,
                    )
                await t.next_change(min(left, 1.0))
            return replica
        finally:
            t.window.queued -= 1
            t.last_activity = self.clock()
