"""The AutoScaler against a real PostgreSQL (and a real NATS lease), with a test clock: scale
up on qps, cooldowns, scale down keeping young replicas and rank 0, scale from zero, quota
cap and suspended tenant, gpu_utilization from the telemetry store, yielding to a schedule
window, the fence of a deposed leader, and one acting instance per lease.

The router's figures are handed to the AutoScaler's RouterFigures as the bus would deliver them
(the e2e test, test_e2e_autoscale.py, has the real router publish them).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest
from nats.aio.client import Client

from libs.bus.lease import Lease, open_lease_bucket
from libs.bus.nats import connect
from libs.controller import Term, run_controller
from libs.domain.errors import Fenced
from libs.domain.group.router_figures import RouterFigures
from libs.domain.group.serving import ServingMetrics
from libs.domain.reasons import ReasonCode
from libs.domain.rollout.decide import decide_drain
from libs.domain.task.decide import decide_transition
from libs.domain.task.states import Actor, TaskStatus
from libs.domain.telemetry import GpuSample, TelemetryBatch
from libs.store import telemetry
from libs.store.fenced import FencedWriter
from libs.store.fencing import Fence
from services.autoscaler.controllers.scaler import AutoScaler
from services.autoscaler.controllers.windows import WindowController
from tests.wait import wait_until_async

from .helpers import Api

pytestmark = pytest.mark.integration


def writer(api: Api) -> FencedWriter:
    """A leader's writer under a lease of its own (a term no other test contends for)."""
    return FencedWriter(api.store, Fence(f"test-{uuid.uuid4().hex[:8]}", 1))


QPS = {"metric": "qps", "target": 10, "max_replicas": 8, "cooldown_down_s": 120}


def now() -> datetime:
    return datetime.now(UTC)


def later(minutes: float) -> Callable[[], datetime]:
    return lambda: now() + timedelta(minutes=minutes)


async def make_group(api: Api, auto_scale: dict[str, Any] = QPS, **extra: Any) -> str:
    body = {"name": "web", "image": "busybox:latest", "task_count": 2, "auto_scale": auto_scale}
    r = await api.client.post("/api/v1/task-groups", json=body | extra, headers=api.tenant)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def view(api: Api, gid: str) -> dict[str, Any]:
    r = await api.client.get(f"/api/v1/task-groups/{gid}", headers=api.tenant)
    assert r.status_code == 200, r.text
    return dict(r.json())


async def run_members(api: Api, gid: str) -> None:
    for t in (await view(api, gid))["tasks"]:
        for to in (TaskStatus.SCHEDULED, TaskStatus.STARTING, TaskStatus.RUNNING):
            await api.store.execute(
                t["id"],
                partial(
                    decide_transition, to=to, actor=Actor.SCHEDULER, reason_code=ReasonCode.REPORTED
                ),
            )


def hear(book: RouterFigures, gid: str, rps: float, gateway: str = "gw-1") -> None:
    m = ServingMetrics(
        target_id=gid,
        tenant_id="acme",
        gateway=gateway,
        requests_per_second=rps,
        concurrent_requests=0,
        latency_p95_ms=5.0,
        queued_requests=0,
        replicas=2,
        ready_replicas=2,
        at=now(),
    )
    book.record(m)


async def decisions(api: Api, gid: str) -> list[dict[str, Any]]:
    return [
        e.payload for e in await api.store.read_stream(gid) if e.type == "group_autoscale_decided"
    ]


async def scaled(api: Api, gid: str) -> list[dict[str, Any]]:
    return [e.payload for e in await api.store.read_stream(gid) if e.type == "group_scaled"]


def live_ranks(g: dict[str, Any]) -> list[int]:
    ended = {"cancelled", "stopped", "completed", "failed"}
    return sorted(t["rank"] for t in g["tasks"] if t["status"] not in ended)


async def test_qps_scales_up_then_cooldowns_then_down_to_min(api: Api) -> None:
    gid = await make_group(api)
    book = RouterFigures(max_age_s=60)
    hear(book, gid, rps=60)  # 30 per replica, target 10: ceil(2 × 30 / 10) = 6
    d = (await AutoScaler(api.store, book, now).scan(writer(api)))[gid]
    assert (d.why, d.current, d.computed, d.replicas) == ("scale_up", 2, 6, 6)
    g = await view(api, gid)
    assert g["replicas"] == 6 and live_ranks(g) == [0, 1, 2, 3, 4, 5]
    assert g["last_autoscale"]["why"] == "scale_up"
    [event] = await scaled(api, gid)
    assert event["source"] == "autoscaler" and event["reason_code"] == "autoscale"

    hear(book, gid, rps=100)  # wants 10 → max 8, but the up cooldown (60 s) holds
    d = (await AutoScaler(api.store, book, now).scan(writer(api)))[gid]
    assert (d.why, d.computed, d.replicas) == ("cooldown_up", 8, 6)
    before = len(await decisions(api, gid))
    await AutoScaler(api.store, book, now).scan(
        writer(api)
    )  # the same "no change": not recorded again
    assert len(await decisions(api, gid)) == before == 2

    hear(book, gid, rps=0)
    d = (await AutoScaler(api.store, book, later(1)).scan(writer(api)))[gid]
    assert (d.why, d.replicas) == ("cooldown_down", 6)  # 120 s since the last scale
    d = (await AutoScaler(api.store, book, later(10)).scan(writer(api)))[gid]
    assert (d.why, d.computed, d.replicas) == ("scale_down", 1, 1)  # min_replicas 1
    g = await view(api, gid)
    assert g["replicas"] == 1 and live_ranks(g) == [0]
    assert len(g["superseded_tasks"]) == 5
    assert [(e["from_replicas"], e["to_replicas"]) for e in await scaled(api, gid)] == [
        (2, 6),
        (6, 1),
    ]


async def test_young_replicas_and_rank_zero_of_a_non_split_group_are_kept(api: Api) -> None:
    cfg = QPS | {"min_replicas": 0}
    gid = await make_group(api, cfg, task_count=3, parallelism="data_parallel")
    await run_members(api, gid)
    book = RouterFigures(max_age_s=60)
    hear(book, gid, rps=0)
    d = (await AutoScaler(api.store, book, now).scan(writer(api)))[gid]
    assert (d.why, d.computed, d.replicas) == ("young_replicas", 0, 3)
    rank0 = next(t["id"] for t in (await view(api, gid))["tasks"] if t["rank"] == 0)

    d = (await AutoScaler(api.store, book, later(2)).scan(writer(api)))[gid]
    assert (d.why, d.computed, d.replicas) == ("scale_down", 0, 1)
    g = await view(api, gid)
    assert [(t["rank"], t["id"], t["status"]) for t in g["tasks"]] == [(0, rank0, "running")]
    assert {t["status"] for t in (await view(api, gid))["tasks"]} == {"running"}
    d = (await AutoScaler(api.store, book, later(60)).scan(writer(api)))[gid]
    assert (d.why, d.replicas) == ("at_target", 1)  # rank 0 is never removed


async def test_scale_from_zero_after_every_replica_is_stopped(api: Api) -> None:
    gid = await make_group(api, QPS | {"min_replicas": 2})
    r = await api.client.post(f"/api/v1/task-groups/{gid}/stop", headers=api.tenant)
    assert r.status_code == 200, r.text
    old = {t["id"] for t in (await view(api, gid))["tasks"]}
    assert {t["status"] for t in (await view(api, gid))["tasks"]} == {"cancelled"}

    d = (await AutoScaler(api.store, RouterFigures(60), now).scan(writer(api)))[
        gid
    ]  # no metric needed
    assert (d.why, d.current, d.replicas) == ("scale_from_zero", 0, 2)
    g = await view(api, gid)
    assert [(t["rank"], t["status"]) for t in g["tasks"]] == [(0, "pending"), (1, "pending")]
    assert not old & {t["id"] for t in g["tasks"]}


async def test_quota_caps_new_replicas_and_a_suspended_tenant_gets_none(api: Api) -> None:
    r = await api.client.put("/api/v1/tenants/acme", json={"gpu_quota": 3}, headers=api.operator)
    assert r.status_code == 200, r.text
    gid = await make_group(api, QPS | {"cooldown_up_s": 0}, gpu_required=1)
    book = RouterFigures(max_age_s=60)
    hear(book, gid, rps=80)  # wants 8; 2 cards taken, 1 left
    d = (await AutoScaler(api.store, book, now).scan(writer(api)))[gid]
    assert (d.why, d.computed, d.replicas) == ("quota_capped", 8, 3)
    d = (await AutoScaler(api.store, book, now).scan(writer(api)))[gid]
    assert (d.why, d.replicas) == ("quota_exhausted", 3)

    r = await api.client.put("/api/v1/tenants/acme", json={"suspended": True}, headers=api.operator)
    assert r.status_code == 200, r.text
    d = (await AutoScaler(api.store, book, now).scan(writer(api)))[gid]
    assert (d.why, d.replicas) == ("tenant_suspended", 3)
    assert [p["why"] for p in await decisions(api, gid)] == [
        "quota_capped",
        "quota_exhausted",
        "tenant_suspended",
    ]


async def test_gpu_utilization_is_the_mean_over_the_groups_cards(api: Api) -> None:
    cfg = {"metric": "gpu_utilization", "target": 50, "max_replicas": 8}
    gid = await make_group(api, cfg)
    members = [t["id"] for t in (await view(api, gid))["tasks"]]
    # Telemetry is kept only for tasks placed on the node that sends it.
    for tid in members:
        await api.place(tid, "n1")
    at = now()
    samples = [
        GpuSample(
            gpu_id=f"gpu-{i}",
            task_ids=(tid,),
            utilization_pct=pct,
            memory_used_mb=1,
            memory_total_mb=2,
            power_w=None,
            at=at - timedelta(seconds=s),
        )
        for i, (tid, pct) in enumerate(zip(members, (100.0, 80.0), strict=True))
        for s in (1, 5)
    ]
    await telemetry.write(api.store, TelemetryBatch(node_id="n1", samples=tuple(samples)))
    d = (await AutoScaler(api.store, RouterFigures(60), now).scan(writer(api)))[gid]
    # mean 90 over two cards, target 50: ceil(2 × 90 / 50) = 4
    assert (d.why, d.replicas) == ("scale_up", 4)
    assert (await decisions(api, gid))[-1]["value"] == pytest.approx(90.0)


async def test_a_replica_draining_too_long_is_ended(api: Api) -> None:
    gid = await make_group(api, QPS | {"min_replicas": 2})
    await run_members(api, gid)
    rank1 = next(t["id"] for t in (await view(api, gid))["tasks"] if t["rank"] == 1)
    await api.store.execute(rank1, decide_drain)
    book = RouterFigures(max_age_s=60)
    hear(book, gid, rps=20)
    await AutoScaler(api.store, book, later(1)).scan(writer(api))  # draining 60 s: kept
    assert (await api.store.get_task(rank1)).status is TaskStatus.RUNNING
    await AutoScaler(api.store, book, later(3)).scan(writer(api))  # past 120 s: ended
    ended = await api.store.get_task(rank1)
    assert ended.status is TaskStatus.STOPPING and ended.status_reason_code == "autoscale"


async def test_no_change_while_a_window_action_is_in_force(api: Api) -> None:
    window = {"start": "22:00", "end": "06:00", "action": "scale", "scale_to": 0}
    gid = await make_group(api, QPS, schedule_window=window)
    noon = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
    assert await WindowController(api.store, lambda: noon).scan(writer(api)) == 1
    book = RouterFigures(max_age_s=60)
    hear(book, gid, rps=500)
    d = (await AutoScaler(api.store, book, later(30)).scan(writer(api)))[gid]
    assert (d.why, d.current, d.replicas) == ("schedule_window", 0, 0)
    g = await view(api, gid)
    assert g["replicas"] == 0 and live_ranks(g) == []
    assert [e["source"] for e in await scaled(api, gid)] == ["schedule_window"]


async def test_no_change_while_a_rollout_holds_the_group(api: Api) -> None:
    gid = await make_group(api)
    url = f"/api/v1/task-groups/{gid}/rollout"
    r = await api.client.post(url, json={"image": "busybox:v2"}, headers=api.tenant)
    assert r.status_code == 202, r.text
    book = RouterFigures(max_age_s=60)
    hear(book, gid, rps=500)
    d = (await AutoScaler(api.store, book, now).scan(writer(api)))[gid]
    assert (d.why, d.replicas) == ("rollout", 2)
    assert (await view(api, gid))["replicas"] == 2


async def test_a_deposed_leaders_scale_is_refused_by_the_fence(api: Api) -> None:
    gid = await make_group(api)
    book = RouterFigures(max_age_s=60)
    hear(book, gid, rps=500)
    old = AutoScaler(api.store, book, now)
    await api.store.claim_fence(Fence("autoscaler", 2))  # a newer leader was elected
    versions = [e.version for e in await api.store.read_stream(gid)]
    with pytest.raises(Fenced):
        await old.scan(FencedWriter(api.store, Fence("autoscaler", 1)))
    assert [e.version for e in await api.store.read_stream(gid)] == versions  # nothing written
    g = await view(api, gid)
    assert g["replicas"] == 2 and len(g["tasks"]) == 2 and g["last_autoscale"] is None


# --- one acting instance per lease ------------------------------------------------------


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    client = await connect(nats_url, "test-autoscaler")
    yield client
    await client.close()


class Counting(AutoScaler):
    """An AutoScaler that records its passes."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.passes = 0

    async def evaluate(self, term: Term) -> None:
        self.passes += 1
        await super().evaluate(term)


async def test_a_second_instance_never_acts_while_the_first_holds_the_lease(
    api: Api, nc: Client
) -> None:
    gid = await make_group(api, QPS | {"cooldown_up_s": 0})
    js = nc.jetstream()
    bucket = "hf_leases_" + uuid.uuid4().hex[:8]
    kv = await open_lease_bucket(js, 1.0, bucket=bucket)
    book = RouterFigures(max_age_s=60)
    hear(book, gid, rps=30)  # wants 3
    a = Counting(api.store, book, now, interval_s=0.05)
    b = Counting(api.store, book, now, interval_s=0.05)
    stop_a, stop_b = asyncio.Event(), asyncio.Event()

    def start(ctl: Counting, who: str, stop: asyncio.Event) -> asyncio.Task[None]:
        lease = Lease(kv, "autoscaler", who, 1.0)
        return asyncio.create_task(
            run_controller(ctl, lease, stop, renew_every=0.2, retry_every=0.1, store=api.store)
        )

    ta = start(a, "a", stop_a)
    await wait_until_async(lambda: a.passes >= 1, 10.0, 0.05, "a leads")
    tb = start(b, "b", stop_b)
    try:
        await wait_until_async(
            lambda: a.passes >= 40, 10.0, 0.05, "a keeps leading for many passes"
        )
        assert b.passes == 0
        assert (await view(api, gid))["replicas"] == 3
        stop_a.set()
        await ta
        hear(book, gid, rps=50)  # wants 5: only b can act now
        await wait_until_async(lambda: b.passes >= 1, 10.0, 0.05, "b takes over once a has gone")
        deadline = time.monotonic() + 10
        while (await view(api, gid))["replicas"] != 5:
            assert time.monotonic() < deadline, "b did not scale"
            await asyncio.sleep(0.05)
        fences = {e.metadata.get("fencing_token") for e in await api.store.read_stream(gid)}
        assert len(fences - {None}) == 2  # a's scale and b's, each under its own term
    finally:
        stop_a.set()
        stop_b.set()
        await asyncio.gather(ta, tb)
        await js.delete_key_value(bucket)
