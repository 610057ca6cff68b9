"""`?as_of=` on the reads of a task, a group, a job and a node, against a real PostgreSQL.

Through a run of state changes the live answer is read after each change, with the time;
`as_of` that time, asked then and again at the end, gives the same body: the fold of the log
up to a time is the state the live read showed at that time, the earlier states included.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from libs.domain.node.events import NodeOffline, NodeRegistered
from libs.domain.node.model import NodeInventory
from libs.domain.reasons import ReasonCode
from libs.store.projections import NODES

from .helpers import AGENT_NODE, Api

pytestmark = pytest.mark.integration

GROUP = {"name": "web", "image": "busybox:latest", "command": "httpd -f", "task_count": 2}


async def get(api: Api, path: str, headers: dict[str, str], at: datetime | None = None) -> Any:
    """The body, less `pending` (the live estimate, computed from the cluster now: an `as_of`
    answer leaves it out)."""
    params = {"as_of": at.isoformat()} if at is not None else None
    r = await api.client.get(f"/api/v1/{path}", headers=headers, params=params)
    assert r.status_code == 200, r.text
    body = r.json()
    if at is not None:
        assert "pending" not in body, body
    body.pop("pending", None)
    return body


class Run:
    """Live reads of some paths after each change, each with the time just after it."""

    def __init__(self, api: Api, paths: list[tuple[str, dict[str, str]]]) -> None:
        self.api, self.paths = api, paths
        self.seen: list[tuple[datetime, list[Any]]] = []

    async def step(self) -> None:
        at = datetime.now(UTC)
        live = [await get(self.api, p, h) for p, h in self.paths]
        then = [await get(self.api, p, h, at) for p, h in self.paths]
        assert then == live, "as_of now differs from the live answer"
        self.seen.append((at, live))

    async def replayed(self) -> None:
        for at, live in self.seen:
            assert [await get(self.api, p, h, at) for p, h in self.paths] == live, at
        assert len({str(live) for _, live in self.seen}) == len(self.seen), "states differ"


async def put(api: Api, task_id: str, body: dict[str, Any]) -> None:
    r = await api.client.put(f"/api/v1/tasks/{task_id}", json=body, headers=api.operator)
    assert r.status_code == 200, r.text


async def test_as_of_is_the_live_answer_then(api: Api) -> None:
    async def node(*events: Any) -> None:
        await api.store.execute_aggregate(NODES, AGENT_NODE, lambda _n: list(events))

    before = datetime.now(UTC)
    await node(
        NodeRegistered(node_id=AGENT_NODE, inventory=NodeInventory(memory_mb=8192, cpu_cores=4))
    )
    r = await api.client.post(
        "/api/v1/tasks", json={"name": "t", "image": "busybox"}, headers=api.tenant
    )
    task_id = r.json()["id"]
    r = await api.client.post("/api/v1/task-groups", json=GROUP, headers=api.tenant)
    assert r.status_code == 201, r.text
    group_id, member = r.json()["id"], r.json()["tasks"][0]["id"]
    run = Run(
        api,
        [
            (f"tasks/{task_id}", api.tenant),
            (f"task-groups/{group_id}", api.tenant),
            (f"nodes/{AGENT_NODE}", api.operator),
        ],
    )
    await run.step()
    await api.place(task_id)
    await api.place(member)
    await run.step()
    await put(api, task_id, {"status": "running"})
    await put(api, member, {"status": "running"})
    await run.step()
    await node(NodeOffline(node_id=AGENT_NODE, silent_seconds=30, reason_code=ReasonCode.NODE_LOST))
    r = await api.client.post(f"/api/v1/tasks/{task_id}/stop", headers=api.tenant)
    assert r.status_code == 200, r.text
    await run.step()
    await run.replayed()

    # Before it existed: 404, as a task that never existed; another tenant's: 404.
    for path, headers in run.paths:
        r = await api.client.get(
            f"/api/v1/{path}", headers=headers, params={"as_of": before.isoformat()}
        )
        assert r.status_code == 404, (path, r.text)
    r = await api.client.get(
        f"/api/v1/tasks/{task_id}",
        headers=api.other_tenant,
        params={"as_of": datetime.now(UTC).isoformat()},
    )
    assert r.status_code == 404, r.text


async def test_as_of_of_a_job_follows_its_tasks(api: Api) -> None:
    body = {
        "name": "pipe",
        "tasks": [
            {"key": "prep", "name": "prep", "image": "busybox:latest"},
            {"key": "train", "name": "train", "image": "busybox:latest"},
        ],
        "dependencies": [{"task": "train", "on": "prep"}],
    }
    r = await api.client.post("/api/v1/jobs", json=body, headers=api.tenant)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    prep = r.json()["tasks"][0]["task"]["id"]
    run = Run(api, [(f"jobs/{job_id}", api.tenant)])
    await run.step()
    await api.place(prep)
    await put(api, prep, {"status": "running"})
    await run.step()
    r = await api.client.post(f"/api/v1/jobs/{job_id}/stop", headers=api.tenant)
    assert r.status_code == 200, r.text
    await run.step()
    await run.replayed()


@pytest.mark.parametrize(
    "value",
    [
        "yesterday",
        "2026-12-01",
        "2026-12-01T12:00:00",
        "1700000000",
        "2026-13-01T00:00:00Z",
        "",
        "20261201T120000Z",
        "2026-W48-2T12:00:00Z",
        "2026-12-01T12+00:00",
    ],
    ids=[
        "words",
        "date only",
        "no offset",
        "epoch",
        "month 13",
        "empty",
        "basic format",
        "week date",
        "hour only",
    ],
)
async def test_a_bad_as_of_is_refused_by_name(api: Api, value: str) -> None:
    r = await api.client.post(
        "/api/v1/tasks", json={"name": "t", "image": "busybox"}, headers=api.tenant
    )
    task_id = r.json()["id"]
    r = await api.client.get(
        f"/api/v1/tasks/{task_id}", headers=api.tenant, params={"as_of": value}
    )
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["code"] == 40003 and body["fields"] == ["as_of"], body
    assert "RFC 3339" in body["error"], body
    later = (datetime.now(UTC) + timedelta(days=1)).isoformat().replace("+00:00", "Z")
    r = await api.client.get(f"/api/v1/tasks/{task_id}", headers=api.tenant, params={"at": later})
    assert r.status_code == 400 and r.json()["code"] == 40001, r.text
