"""The idle-sleep controller (services/autoscaler/controllers/idle_sleep.py) against a real
PostgreSQL, with test clocks: a serving target sleeps once idle for its timeout by the
routers' figures, not while a request is held, and, when no router reports it, once idle
since its members became running; a deposed leader's sleep is refused by the fence."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest

from libs.domain.errors import Fenced
from libs.domain.group.router_figures import RouterFigures
from libs.domain.group.serving import ServingMetrics
from libs.domain.reasons import ReasonCode
from libs.domain.task.decide import decide_transition
from libs.domain.task.states import Actor, TaskStatus
from libs.store.fenced import FencedWriter
from libs.store.fencing import Fence
from services.autoscaler.controllers.idle_sleep import IdleSleeper

from .helpers import Api

pytestmark = pytest.mark.integration

S = TaskStatus
MINUTE_S = 10.0  # idle_timeout_minutes=1: idle after 10 s
SERVING = {"port": 8000, "health_path": "/healthz"}


def writer(api: Api, token: int = 1, lease: str = "") -> FencedWriter:
    return FencedWriter(api.store, Fence(lease or f"test-{uuid.uuid4().hex[:8]}", token))


class Clocks:
    """The book's monotonic clock and the controller's wall clock, moved together."""

    def __init__(self) -> None:
        self.mono = 10_000.0
        self.wall = datetime.now(UTC)

    def tick(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += timedelta(seconds=seconds)


def sleeper(api: Api, clocks: Clocks) -> tuple[IdleSleeper, RouterFigures]:
    book = RouterFigures(max_age_s=30, clock=lambda: clocks.mono)
    ctl = IdleSleeper(api.store, book, lambda: clocks.wall, minute_s=MINUTE_S, listen_s=0)
    return ctl, book


def figures(target: str, idle_s: float, *, concurrent: int = 0, queued: int = 0) -> ServingMetrics:
    return ServingMetrics(
        target_id=target,
        tenant_id="acme",
        gateway="gw-1",
        requests_per_second=0.0,
        concurrent_requests=concurrent,
        latency_p95_ms=0.0,
        queued_requests=queued,
        replicas=1,
        ready_replicas=1,
        idle_s=idle_s,
        at=datetime.now(UTC),
    )


async def run(api: Api, task_id: str) -> None:
    for to in (S.SCHEDULED, S.STARTING, S.RUNNING):
        await api.store.execute(
            task_id,
            partial(decide_transition, to=to, actor=Actor.SCHEDULER, reason_code=ReasonCode.PLACED),
        )


async def serving_task(api: Api, **extra: Any) -> str:
    body = {
        "name": "llm",
        "image": "busybox:latest",
        "task_type": "inference",
        "serving": SERVING,
        "idle_timeout_minutes": 1,
    }
    r = await api.client.post("/api/v1/tasks", json=body | extra, headers=api.tenant)
    assert r.status_code == 201, r.text
    task_id = str(r.json()["id"])
    await run(api, task_id)
    return task_id


async def status(api: Api, task_id: str) -> TaskStatus:
    return (await api.store.get_task(task_id)).status


async def test_a_target_sleeps_once_idle_by_the_figures_not_while_a_request_is_held(
    api: Api,
) -> None:
    clocks = Clocks()
    tid = await serving_task(api)
    ctl, book = sleeper(api, clocks)
    clocks.tick(60)  # running for a minute...
    book.record(figures(tid, idle_s=4))  # ...but a router saw a request 4 s ago
    assert tid not in await ctl.scan(writer(api))
    clocks.tick(7)  # idle 11 s, yet a request is queued at a router
    book.record(figures(tid, idle_s=11, queued=1))
    assert tid not in await ctl.scan(writer(api))
    assert await status(api, tid) is S.RUNNING
    clocks.tick(5)
    book.record(figures(tid, idle_s=5))  # the held request was served 5 s ago
    assert tid not in await ctl.scan(writer(api))
    clocks.tick(6)  # idle 11 s, nothing held
    out = writer(api, token=3)
    assert tid in await ctl.scan(out)
    slept = await api.store.get_task(tid)
    assert slept.status is S.SLEEPING and slept.status_reason_code is ReasonCode.IDLE_SLEEP
    last = (await api.store.read_stream(tid))[-1]
    assert last.metadata["fencing_token"] == 3 and last.metadata["lease"] == out.fence.lease
    assert tid not in await ctl.scan(writer(api)), "asleep: nothing more to do"


async def test_a_target_no_router_reports_is_idle_since_its_members_became_running(
    api: Api,
) -> None:
    clocks = Clocks()
    tid = await serving_task(api)
    ctl, _ = sleeper(api, clocks)
    clocks.tick(5)
    assert tid not in await ctl.scan(writer(api))  # running for 5 s only
    clocks.tick(6)
    assert tid in await ctl.scan(writer(api))
    assert await status(api, tid) is S.SLEEPING


async def test_a_woken_target_is_not_taken_as_idle_by_its_old_figures(api: Api) -> None:
    clocks = Clocks()
    tid = await serving_task(api)
    ctl, book = sleeper(api, clocks)
    book.record(figures(tid, idle_s=0))
    clocks.tick(60)  # its last request a minute ago, but it has just become running again
    for to in (S.SLEEPING, S.WAKING, S.RUNNING):
        await api.store.execute(
            tid,
            partial(
                decide_transition, to=to, actor=Actor.CONTROLLER, reason_code=ReasonCode.REPORTED
            ),
        )
    clocks.wall = datetime.now(UTC) + timedelta(seconds=3)
    assert tid not in await ctl.scan(writer(api))
    clocks.wall += timedelta(seconds=10)
    assert tid in await ctl.scan(writer(api))


async def test_no_timeout_never_sleeps_and_a_group_sleeps_whole(api: Api) -> None:
    clocks = Clocks()
    never = await serving_task(api, idle_timeout_minutes=0)
    body = {
        "name": "llm",
        "image": "busybox:latest",
        "task_type": "inference",
        "serving": SERVING,
        "idle_timeout_minutes": 1,
        "task_count": 2,
    }
    r = await api.client.post("/api/v1/task-groups", json=body, headers=api.tenant)
    assert r.status_code == 201, r.text
    gid = str(r.json()["id"])
    members = [t["id"] for t in r.json()["tasks"]]
    for m in members:
        await run(api, m)
    ctl, _ = sleeper(api, clocks)
    clocks.tick(3600)
    slept = await ctl.scan(writer(api))
    assert gid in slept and never not in slept
    assert [await status(api, m) for m in members] == [S.SLEEPING, S.SLEEPING]
    assert await status(api, never) is S.RUNNING


async def test_nothing_sleeps_before_the_book_has_listened(api: Api) -> None:
    clocks = Clocks()
    tid = await serving_task(api)
    book = RouterFigures(max_age_s=30, clock=lambda: clocks.mono)
    ctl = IdleSleeper(api.store, book, lambda: clocks.wall, minute_s=MINUTE_S, listen_s=10)
    clocks.wall += timedelta(hours=1)  # idle for long since running, by the wall clock
    clocks.mono += 5  # but the book has heard the routers for 5 s only
    assert await ctl.scan(writer(api)) == []
    clocks.mono += 5
    assert tid in await ctl.scan(writer(api))


async def test_a_deposed_leaders_sleep_is_refused_by_the_fence(api: Api) -> None:
    clocks = Clocks()
    tid = await serving_task(api)
    ctl, _ = sleeper(api, clocks)
    clocks.tick(3600)
    lease = f"idle-sleep-{uuid.uuid4().hex[:8]}"
    await api.store.claim_fence(Fence(lease, 2))  # a newer leader was elected
    version = (await api.store.get_task(tid)).version
    with pytest.raises(Fenced):
        await ctl.scan(writer(api, token=1, lease=lease))
    after = await api.store.get_task(tid)
    assert after.status is S.RUNNING and after.version == version
