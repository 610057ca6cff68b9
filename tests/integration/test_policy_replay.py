"""`heteroflow policy replay` over a run recorded by the real scheduler against a real
PostgreSQL: the recorded policy replayed gives back every placement (task, node, cards,
time), a tenant's quota halved makes it wait longer and the other tenant not, and the same
log and policy give the same bytes.

The run is `python -m bench scheduler`-style load on a simulated clock: two tenants submit
one-card tasks every second onto two 4-card nodes, each through its queue, for 30 s; the
scheduler's `Placer` places them round by round (preempting for a high-priority task), and
an agent's reports start them and end them after their runtime.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest

from heteroflow.cli_policy import read_log, report_of
from libs import auth
from libs.domain.group.router_figures import RouterFigures
from libs.domain.group.serving import ServingMetrics
from libs.domain.node.events import NodeRegistered
from libs.domain.node.model import GpuCard, NodeInventory
from libs.domain.payload import Payload
from libs.domain.pool.events import PoolCreated, QueueCreated
from libs.domain.pool.model import NodeSelector, PoolSpec, QueueSpec, pool_stream, queue_stream
from libs.domain.reasons import ReasonCode
from libs.domain.task.decide import decide_transition
from libs.domain.task.model import TaskSpec, TenantId
from libs.domain.task.states import Actor, TaskStatus
from libs.store.eventstore import EventStore
from libs.store.fenced import FencedWriter
from libs.store.fencing import Fence
from libs.store.projections import NODES, POOLS, QUEUES
from services.autoscaler.controllers.scaler import AutoScaler
from services.scheduler.controllers.placement import Placer

from .helpers import Api

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 1, tzinfo=UTC)
S = TaskStatus


class Run:
    """A recorded run: the store's and the scheduler's clock is `now`, moved by the test."""

    def __init__(self, store: EventStore) -> None:
        self.store, self.now = store, T0
        store.clock = lambda: self.now
        self.placer = Placer(store, clock=lambda: self.now)
        self.runtime: dict[str, float] = {}
        self.ends: dict[str, datetime] = {}

    async def go(self, task_id: str, to: TaskStatus, reason: ReasonCode, **kw: Any) -> None:
        decide = partial(decide_transition, to=to, actor=Actor.AGENT, reason_code=reason, **kw)
        await self.store.execute(task_id, decide)

    async def submit(self, tenant: str, queue: str, runtime: float, **spec: Any) -> None:
        spec = {"gpu_required": 1} | spec
        s = TaskSpec(name="t", image=f"{tenant}:1", queue=queue, **spec)
        (task,) = await self.store.create_tasks([(TenantId(tenant), s, None, None)])
        self.runtime[task.id] = runtime

    async def settle(self) -> None:
        """Rounds until one changes nothing; placed work starts, preempted work stops."""
        while True:
            result = await self.placer.round()
            for task_id in result.placements:
                await self.go(task_id, S.STARTING, ReasonCode.PLACED)
                await self.go(task_id, S.RUNNING, ReasonCode.PLACED)
                self.ends[task_id] = self.now + timedelta(seconds=self.runtime[task_id])
            preempting = [
                t
                for t, end in self.ends.items()
                if (await self.store.get_task(t)).status is S.PREEMPTING
            ]
            for task_id in preempting:
                await self.go(task_id, S.PENDING, ReasonCode.PREEMPTED)
                del self.ends[task_id]
            if preempting:
                self.placer.cluster.invalidate()
            if not result.placed and not preempting:
                return

    async def finish_due(self) -> None:
        due = sorted(t for t, end in self.ends.items() if end <= self.now)
        for task_id in due:
            await self.go(task_id, S.COMPLETED, ReasonCode.EXITED, exit_code=0)
            del self.ends[task_id]
        if due:
            self.placer.cluster.invalidate()  # the service's report handler does this


def once(event: Payload) -> Callable[[Any], list[Payload]]:
    return lambda _: [event]


async def recorded_run(store: EventStore) -> list[Any]:
    run = Run(store)
    await auth.create_tenant(store, "alpha", "Alpha", gpu_quota=6)
    await auth.create_tenant(store, "beta", "Beta", gpu_quota=6)
    await auth.create_tenant(store, "gamma", "Gamma")
    pool = PoolSpec(name="all", node_selector=NodeSelector())
    await store.execute_aggregate(POOLS, pool_stream("all"), once(PoolCreated(spec=pool)))
    for name, tenant in (("alg", "alpha"), ("bq", "beta")):
        q = QueueSpec(name=name, tenant=tenant, pools=("all",))
        await store.execute_aggregate(QUEUES, queue_stream(name), once(QueueCreated(spec=q)))
    for n in ("n1", "n2"):
        cards = tuple(
            GpuCard(id=f"{n}-gpu{i}", index=i, vendor="nvidia", model="A100", vram_mb=40_960)
            for i in range(4)
        )
        inv = NodeInventory(memory_mb=262_144, cpu_cores=64, gpus=cards)
        await store.execute_aggregate(NODES, n, once(NodeRegistered(node_id=n, inventory=inv)))
    for second in range(40):
        run.now = T0 + timedelta(seconds=second)
        await run.finish_due()
        if second < 30:
            await run.submit("alpha", "alg", 4 + second % 3, preemptible=True)
            await run.submit("beta", "bq", 5)
        if second == 12:  # a third tenant's urgent work: the cluster is full, it preempts
            await run.submit("gamma", "", 3, priority=60, gpu_required=2)
        await run.settle()
    return await read_log(store)


async def test_replay_reproduces_the_run_and_a_halved_quota_moves_the_wait(
    database_url: str,
) -> None:
    store = await EventStore.open(database_url, max_size=4)
    try:
        rows = await recorded_run(store)
    finally:
        await store.close()

    same = report_of(rows, [], None)
    rec_places = sorted((r.task_id, r.node_id, r.gpu_ids, r.placed_at) for r in same.recorded.runs)
    sim_places = sorted((r.task_id, r.node_id, r.gpu_ids, r.placed_at) for r in same.replayed.runs)
    assert len(rec_places) > 60, "the run placed its work"
    assert any(r.preempted for r in same.recorded.runs), "the run preempted"
    assert sim_places == rec_places
    assert same.same_policy == (len(rec_places), len(rec_places))

    halved = report_of(rows, ["quota.alpha.max_gpus=3"], "1h")
    rows_of = {(r["scope"], r["name"]): r for r in halved.view()["rows"]}
    alpha, beta = rows_of[("tenant", "alpha")], rows_of[("tenant", "beta")]
    assert alpha["replayed"]["wait_p50_s"] > alpha["recorded"]["wait_p50_s"], alpha
    assert alpha["replayed"]["wait_p95_s"] > alpha["recorded"]["wait_p95_s"], alpha
    assert beta["replayed"]["wait_p95_s"] <= beta["recorded"]["wait_p95_s"], beta
    assert beta["replayed"]["wait_p50_s"] <= beta["recorded"]["wait_p50_s"], beta
    text = halved.text()
    assert "quota.alpha.max_gpus=3" in text and "tenant  alpha" in text and "queue   alg" in text

    # Deterministic: the same log and policy, the same bytes, here and from the command in a
    # process of its own (another hash seed) reading the log from the database.
    again = report_of(list(rows), ["quota.alpha.max_gpus=3"], "1h")
    assert again.text() == text and again.json() == halved.json()
    cli = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "heteroflow.cli", "policy", "replay"]
        + ["--since", "1h", "--set", "quota.alpha.max_gpus=3"],
        env=os.environ | {"HETEROFLOW_DATABASE_URL": database_url, "PYTHONHASHSEED": "random"},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout == text.encode()


async def autoscaled_run(api: Api) -> tuple[str, list[Any]]:
    """A `qps` group run by the real AutoScaler against PostgreSQL: a pass every 30 s of a
    simulated clock (the store's and the AutoScaler's) for 12 minutes, under a load that
    rises to 100 requests/s and falls to none."""
    start = datetime.now(UTC)  # after the fixture's own writes: the log ends with the run
    clock = {"now": start}
    api.store.clock = lambda: clock["now"]
    body = {
        "name": "web",
        "image": "busybox:latest",
        "task_count": 2,
        "auto_scale": {"metric": "qps", "target": 10, "max_replicas": 8, "cooldown_down_s": 120},
    }
    r = await api.client.post("/api/v1/task-groups", json=body, headers=api.tenant)
    assert r.status_code == 201, r.text
    gid = str(r.json()["id"])
    book = RouterFigures(max_age_s=60)
    scaler = AutoScaler(api.store, book, lambda: clock["now"], interval_s=30.0)
    out = FencedWriter(api.store, Fence("test-autoscale-replay", 1))
    load = [30, 60, 100, 100, 100, 80, 40] + [0] * 17
    for n, rps in enumerate(load):
        clock["now"] = start + timedelta(seconds=30 * (n + 1))
        book.record(
            ServingMetrics(
                target_id=gid,
                tenant_id="acme",
                gateway="gw-1",
                requests_per_second=rps,
                concurrent_requests=0,
                latency_p95_ms=5.0,
                queued_requests=0,
                replicas=2,
                ready_replicas=2,
                at=datetime.now(UTC),
            )
        )
        await scaler.scan(out)
    return gid, await read_log(api.store)


async def test_the_autoscaler_replayed_as_recorded_gives_back_its_decisions(
    api: Api, database_url: str
) -> None:
    gid, rows = await autoscaled_run(api)
    decided = [
        (p["current"], p["replicas"])
        for _, sid, _, kind, text, _ in rows
        if sid == gid and kind == "group_autoscale_decided"
        for p in [json.loads(text)]
        if p["replicas"] != p["current"]
    ]
    assert len(decided) >= 3 and decided[0] == (2, 3), decided  # up, up, and down

    same = report_of(rows, [], None).view()["autoscale"]
    (row,) = same["groups"]
    assert same["same_settings_reproduce"] == {"scale_decisions": len(decided), "of": len(decided)}
    assert row["replayed"] == row["recorded"] and row["name"] == "web"
    assert row["recorded"]["scale_events"] == len(decided)
    assert 0 < row["recorded"]["replica_hours"] < 8 * 12 / 60  # at most 8 replicas, 12 min

    slow = report_of(rows, [f"autoscaler.{gid}.cooldown_up_s=600"], None).view()["autoscale"]
    (srow,) = slow["groups"]
    assert srow["replayed"]["scale_events"] < srow["recorded"]["scale_events"], srow
    low = report_of(rows, ["autoscaler.web.target=5"], None)
    (lrow,) = low.view()["autoscale"]["groups"]
    assert lrow["replayed"]["replica_hours"] > lrow["recorded"]["replica_hours"], lrow

    # Deterministic: the same bytes again, and from the command in a process of its own.
    assert report_of(rows, ["autoscaler.web.target=5"], None).text() == low.text()
    cli = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "heteroflow.cli", "policy", "replay"]
        + ["--set", "autoscaler.web.target=5"],
        env=os.environ | {"HETEROFLOW_DATABASE_URL": database_url, "PYTHONHASHSEED": "random"},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout == low.text().encode()
    assert "autoscaler: the recorded settings replayed reproduce" in low.text()
