"""Claims of the task API that had no test: pages past the first and the `node_id` filter,
`qos` refused on create, the group timeline endpoint, and the memory boost's wiring with
its exact log line (real PostgreSQL)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import structlog.testing

from libs.store import timeline as timeline_rows
from libs.store.inbox import Receipt
from services.event_timeline.rules import Entry

from .helpers import AGENT_NODE, Api

pytestmark = pytest.mark.integration

BASE = {"name": "c", "image": "busybox:latest"}


async def create(api: Api, **extra: object) -> str:
    r = await api.client.post("/api/v1/tasks", json=BASE | extra, headers=api.tenant)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def listing(api: Api, query: str) -> Any:
    r = await api.client.get(f"/api/v1/tasks?{query}", headers=api.tenant)
    assert r.status_code == 200, r.text
    return r.json()


async def test_later_pages_and_the_node_filter(api: Api) -> None:
    made = [await create(api, name=f"c{i}") for i in range(5)]
    pages = [await listing(api, f"per_page=2&page={p}&order=asc") for p in (1, 2, 3, 4)]
    ids = [t["id"] for page in pages for t in page["tasks"]]
    assert ids == made, "every task once, in order, across pages"
    assert [len(p["tasks"]) for p in pages] == [2, 2, 1, 0]
    assert {p["total"] for p in pages} == {5} and pages[2]["page"] == 3
    await api.place(made[1], AGENT_NODE)
    await api.place(made[3], AGENT_NODE)
    on_node = await listing(api, f"node_id={AGENT_NODE}&order=asc")
    assert [t["id"] for t in on_node["tasks"]] == [made[1], made[3]]
    assert on_node["total"] == 2
    assert (await listing(api, "node_id=elsewhere"))["total"] == 0


@pytest.mark.parametrize("qos", ["gold", "silver", "bronze"])
async def test_qos_is_refused_on_create(api: Api, qos: str) -> None:
    r = await api.client.post("/api/v1/tasks", json=BASE | {"qos": qos}, headers=api.tenant)
    assert r.status_code == 400, r.text
    assert r.json()["code"] == 40002 and r.json()["fields"] == ["qos"]


async def test_group_events_hold_the_groups_and_its_members_entries(api: Api) -> None:
    body = BASE | {"task_count": 2}
    r = await api.client.post("/api/v1/task-groups", json=body, headers=api.tenant)
    assert r.status_code == 201, r.text
    group = r.json()
    member = group["tasks"][1]["id"]
    now = datetime.now(UTC)

    def entry(subject_type: str, subject_id: str, kind: str, age_s: int) -> Entry:
        return Entry(
            id=f"{uuid.uuid4()}:{subject_type}:{subject_id}",
            subject_type=subject_type,
            subject_id=subject_id,
            kind=kind,
            message=kind,
            occurred_at=now - timedelta(seconds=age_s),
            source_event=str(uuid.uuid4()),
        )

    entries = [
        entry("group", group["id"], "group_restart", 3),
        entry("task", member, "node_lost_migration", 2),
        entry("task", "someone-else", "retry_escalation", 1),
    ]
    await timeline_rows.write(api.store, entries, 200, Receipt("event-timeline", uuid.uuid4()))
    url = f"/api/v1/task-groups/{group['id']}/events"
    r = await api.client.get(url, headers=api.tenant)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["group_id"] == group["id"] and got["total"] == 2
    assert [e["kind"] for e in got["events"]] == ["node_lost_migration", "group_restart"]
    assert (await api.client.get(url, headers=api.other_tenant)).status_code == 404
    r = await api.client.get(f"{url}?per_page=201", headers=api.tenant)
    assert r.status_code == 400 and r.json()["code"] == 40003


async def test_create_boosts_inference_memory_and_logs_the_exact_line(api: Api) -> None:
    body = {"name": "srv", "image": "vllm/vllm-openai:v0.6.3", "gpu_required": 1}
    with structlog.testing.capture_logs() as logs:
        r = await api.client.post("/api/v1/tasks", json=body, headers=api.tenant)
    assert r.status_code == 201, r.text
    assert r.json()["memory_mb"] == 8192, "the spec the scheduler places by"
    lines = [e for e in logs if e["event"].startswith("Auto-boost")]
    assert lines == [
        {
            "event": "Auto-boost GPU inference memory: 2048 → 8192MB",
            "task_id": r.json()["id"],
            "log_level": "info",
        }
    ]
    with structlog.testing.capture_logs() as logs:
        r = await api.client.post(
            "/api/v1/tasks", json=body | {"memory_mb": 4096}, headers=api.tenant
        )
    assert r.json()["memory_mb"] == 4096
    assert not [e for e in logs if e["event"].startswith("Auto-boost")]
