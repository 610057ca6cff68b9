"""Group observability and list discipline over HTTP against a real PostgreSQL: the group
list validates and filters like the task list, group stats, GPU metrics and energy, and the
group timeline's cap of 200 however many members wrote entries."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from libs.domain.group.events import GroupStatusChanged
from libs.domain.group.model import GroupStatus
from libs.domain.reasons import ReasonCode
from libs.domain.telemetry import GpuSample, TelemetryBatch
from libs.store import telemetry
from libs.store import timeline as timeline_rows
from libs.store.inbox import Receipt
from libs.store.projections import GROUPS
from services.event_timeline.rules import Entry

from .helpers import Api

pytestmark = pytest.mark.integration

GROUP = {"name": "web", "image": "busybox:latest", "command": "httpd -f", "task_count": 2}


async def make_group(api: Api, **extra: Any) -> dict[str, Any]:
    r = await api.client.post("/api/v1/task-groups", json=GROUP | extra, headers=api.tenant)
    assert r.status_code == 201, r.text
    return dict(r.json())


async def set_status(api: Api, group_id: str, to: GroupStatus) -> None:
    """As the group controller (not running here) records an aggregated status."""
    ev = GroupStatusChanged(
        group_id=group_id,
        from_status=GroupStatus.PENDING,
        to_status=to,
        reason_code=ReasonCode.UNSPECIFIED,
    )
    await api.store.execute_aggregate(GROUPS, group_id, lambda _g: [ev])


async def groups(api: Api, query: str) -> tuple[int, Any]:
    r = await api.client.get(f"/api/v1/task-groups?{query}", headers=api.tenant)
    return r.status_code, r.json()


@pytest.mark.parametrize(
    ("query", "code", "field"),
    [
        ("page=abc", 40003, "page"),
        ("page=0", 40003, "page"),
        ("per_page=x", 40003, "per_page"),
        ("per_page=501", 40003, "per_page"),
        ("status=done", 40003, "status"),
        ("status=waking", 40003, "status"),  # a task status, not a group's
        ("sort=size", 40003, "sort"),
        ("order=up", 40003, "order"),
        ("labels=novalue", 40003, "labels"),
        ("node_id=n1", 40001, "node_id"),
        ("colour=red", 40001, "colour"),
    ],
)
async def test_group_list_refuses_bad_queries_by_name(
    api: Api, query: str, code: int, field: str
) -> None:
    status, body = await groups(api, query)
    assert status == 400 and body["code"] == code, body
    assert body["fields"] == [field]


async def test_group_list_filters_and_sorts_like_the_task_list(api: Api) -> None:
    low = await make_group(api, name="web-low", priority=5, labels={"team": "a"})
    high = await make_group(api, name="web-high", priority=50, labels={"team": "b"})
    other = await make_group(api, name="batch", labels={"team": "a"})
    await api.client.post("/api/v1/task-groups", json=GROUP, headers=api.other_tenant)

    def ids(body: Any) -> list[str]:
        return [g["id"] for g in body["groups"]]

    _, body = await groups(api, "sort=priority&order=desc")
    assert ids(body) == [high["id"], low["id"], other["id"]]
    _, body = await groups(api, "sort=created_at&order=asc")
    assert ids(body) == [low["id"], high["id"], other["id"]]
    _, body = await groups(api, "name=WEB")
    assert set(ids(body)) == {low["id"], high["id"]} and body["total"] == 2
    _, body = await groups(api, "labels=team=a")
    assert set(ids(body)) == {low["id"], other["id"]}
    _, body = await groups(api, "status=PENDING&per_page=1&page=3")
    assert ids(body) == [low["id"]] and body["total"] == 3  # newest first by default
    await set_status(api, other["id"], GroupStatus.STOPPED)
    _, body = await groups(api, "status=STOPPED")
    assert ids(body) == [other["id"]]


async def test_group_stats_count_the_tenants_groups_by_status(api: Api) -> None:
    await make_group(api)
    stopped = await make_group(api)
    await set_status(api, stopped["id"], GroupStatus.STOPPED)
    await api.client.post("/api/v1/task-groups", json=GROUP, headers=api.other_tenant)
    r = await api.client.get("/api/v1/task-groups/stats", headers=api.tenant)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["total"] == 2
    assert body["by_status"]["pending"] == 1 and body["by_status"]["stopped"] == 1
    assert set(body["by_status"]) >= {"running", "failed", "completed", "sleeping"}


async def test_group_gpu_metrics_and_energy_cover_every_member(api: Api) -> None:
    g = await make_group(api)
    t0, t1 = (t["id"] for t in sorted(g["tasks"], key=lambda t: t["rank"]))
    await api.place(t0, "n1")  # telemetry is kept only for tasks placed on the sending node
    now = datetime.now(UTC).replace(microsecond=0)
    samples = tuple(
        GpuSample(
            gpu_id="gpu-0",
            task_ids=(t0,),
            utilization_pct=50.0,
            memory_used_mb=1000.0,
            memory_total_mb=24000.0,
            power_w=360.0,
            at=now - timedelta(seconds=30 - 10 * i),
        )
        for i in range(3)
    )
    await telemetry.write(api.store, TelemetryBatch(node_id="n1", samples=samples))

    r = await api.client.get(f"/api/v1/task-groups/{g['id']}/gpu-metrics", headers=api.tenant)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["group_id"] == g["id"] and body["measured"] is True
    by_task = {m["task_id"]: m for m in body["tasks"]}
    assert [m["rank"] for m in body["tasks"]] == [0, 1]
    assert by_task[t0]["series"][0]["gpu_id"] == "gpu-0" and by_task[t1]["series"] == []

    r = await api.client.get(f"/api/v1/task-groups/{g['id']}/energy", headers=api.tenant)
    assert r.status_code == 200, r.text
    body = r.json()
    # 360 W for 20 s = 2 Wh = 0.002 kWh, all of it rank 0's.
    assert body["kwh"] == pytest.approx(0.002) and body["measured"] is True
    assert sum(m["kwh"] for m in body["tasks"]) == pytest.approx(body["kwh"])
    r = await api.client.get(f"/api/v1/task-groups/{g['id']}/energy", headers=api.other_tenant)
    assert r.status_code == 404 and r.json()["code"] == 40401
    r = await api.client.get(
        f"/api/v1/task-groups/{g['id']}/gpu-metrics?step=0", headers=api.tenant
    )
    assert r.status_code == 400 and r.json()["fields"] == ["step"]


async def test_group_timeline_holds_at_most_200_entries(api: Api) -> None:
    g = await make_group(api)
    now = datetime.now(UTC)
    for member in g["tasks"]:  # 150 each: under each task's own cap, 300 together
        entries = [
            Entry(
                id=f"{uuid.uuid4()}:task:{member['id']}",
                subject_type="task",
                subject_id=member["id"],
                kind="retry_escalation",
                message=f"{member['rank']}-{i}",
                occurred_at=now + timedelta(milliseconds=i),
                source_event=str(uuid.uuid4()),
            )
            for i in range(150)
        ]
        await timeline_rows.write(api.store, entries, 200, Receipt("event-timeline", uuid.uuid4()))
    url = f"/api/v1/task-groups/{g['id']}/events"
    first = (await api.client.get(f"{url}?per_page=200", headers=api.tenant)).json()
    assert first["total"] == 200 and len(first["events"]) == 200
    second = (await api.client.get(f"{url}?per_page=200&page=2", headers=api.tenant)).json()
    assert second["events"] == []
    stamps = [e["occurred_at"] for e in first["events"]]
    assert stamps == sorted(stamps, reverse=True), "newest first"
