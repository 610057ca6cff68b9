"""The AutoScaler's scale-down of a `split` group and its reconcile pass against a real
PostgreSQL, with a test clock and router figures handed to its book as the bus would deliver
them (the end-to-end case with real replicas and the real router: test_e2e_scale_down.py).

* The AutoScaler sheds the replica with the fewest outstanding requests, marked draining.
* A size change whose stops were lost (the process died between the two writes) leaves
  members beyond the size live: the reconcile pass drains them, and stops them once no
  router has a request on them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from libs.domain.group.model import Group
from libs.domain.group.router_figures import RouterFigures
from libs.domain.group.scaling import decide_scale
from libs.domain.group.serving import ServingMetrics
from libs.domain.payload import Payload
from libs.domain.task.states import TaskStatus
from libs.store import tasks as task_rows
from libs.store.eventstore import NewTask
from libs.store.projections import GROUPS
from services.autoscaler.controllers.scaler import AutoScaler

from .helpers import Api
from .test_autoscaler import later, make_group, run_members, view, writer

pytestmark = pytest.mark.integration

SPLIT_QPS = {"metric": "qps", "target": 10, "max_replicas": 8, "cooldown_down_s": 0}
# Replicas that serve: routers may hold requests on them, so a scale-down drains them.
SERVES = {
    "task_type": "inference",
    "serving": {"port": 8000, "health_path": "/healthz"},
    "parallelism": "split",
}


def hear(book: RouterFigures, gid: str, outstanding: dict[str, int], **extra: Any) -> None:
    book.record(
        ServingMetrics(
            target_id=gid,
            tenant_id="acme",
            gateway="gw-1",
            requests_per_second=15.0,
            concurrent_requests=sum(outstanding.values()),
            latency_p95_ms=5.0,
            queued_requests=0,
            replicas=3,
            ready_replicas=3,
            at=datetime.now(UTC),
            outstanding=outstanding,
            **extra,
        )
    )


async def by_rank(api: Api, gid: str) -> dict[int, str]:
    return {t["rank"]: t["id"] for t in (await view(api, gid))["tasks"]}


async def test_the_autoscaler_sheds_the_least_busy_replica_of_a_split_group(api: Api) -> None:
    gid = await make_group(api, SPLIT_QPS, task_count=3, **SERVES)
    await run_members(api, gid)
    ids = await by_rank(api, gid)
    book = RouterFigures(max_age_s=3600)
    # 15 requests/s over 3 replicas, target 10 per replica: ceil(3 × 5 / 10) = 2
    hear(book, gid, {ids[0]: 3, ids[1]: 0, ids[2]: 5})
    d = (await AutoScaler(api.store, book, later(1.5)).scan(writer(api)))[gid]
    assert (d.why, d.current, d.replicas) == ("scale_down", 3, 2)
    [scaled] = [e.payload for e in await api.store.read_stream(gid) if e.type == "group_scaled"]
    assert scaled["removed_task_ids"] == [ids[1]]
    went = await api.store.get_task(ids[1])
    assert (went.status, went.draining, went.rank) == (TaskStatus.RUNNING, True, 2)
    assert await by_rank(api, gid) == {0: ids[0], 1: ids[2]}  # the busiest kept, renumbered


async def test_a_removed_rank_left_live_by_a_crash_is_drained_then_stopped(api: Api) -> None:
    body = {"name": "web", "image": "busybox:latest", "task_count": 3} | SERVES
    r = await api.client.post("/api/v1/task-groups", json=body, headers=api.tenant)
    assert r.status_code == 201, r.text
    gid = r.json()["id"]  # no auto_scale: scaled by hand
    await run_members(api, gid)
    ids = await by_rank(api, gid)

    # The size change is written, the process dies before it sheds anyone.
    tasks = await task_rows.of_group(api.store, gid, include_deleted=False)

    def decide(g: Group | None) -> tuple[list[Payload], list[NewTask]]:
        assert g is not None
        plan = decide_scale(g, tasks, 2, reason="scale requested by a user")
        assert plan.event is not None
        return [plan.event], []

    await api.store.execute_with_tasks(GROUPS, gid, decide)
    assert (await api.store.get_task(ids[2])).draining is False

    book = RouterFigures(max_age_s=3600)
    hear(book, gid, {ids[0]: 4, ids[1]: 1, ids[2]: 6})
    await AutoScaler(api.store, book, later(1.5)).scan(writer(api))
    went = await api.store.get_task(ids[1])  # the least busy, not the rank beyond the size
    assert (went.status, went.draining, went.rank) == (TaskStatus.RUNNING, True, 2)
    assert await by_rank(api, gid) == {0: ids[0], 1: ids[2]}

    # still a request in flight on it: kept; none, and the router knows it drains: stopped
    hear(book, gid, {ids[0]: 4, ids[1]: 1, ids[2]: 6}, draining=[ids[1]])
    await AutoScaler(api.store, book, later(1.5)).scan(writer(api))
    assert (await api.store.get_task(ids[1])).status is TaskStatus.RUNNING
    hear(book, gid, {ids[0]: 4, ids[2]: 6}, draining=[ids[1]])
    await AutoScaler(api.store, book, later(1.5)).scan(writer(api))
    ended = await api.store.get_task(ids[1])
    assert (ended.status, ended.status_reason_code) == (TaskStatus.STOPPING, "scaled_down")
    live = {
        t.id for t in await task_rows.of_group(api.store, gid) if t.status is TaskStatus.RUNNING
    }
    assert live == {ids[0], ids[2]}
