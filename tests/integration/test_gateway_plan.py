"""Plan a submission without writing, and the "why pending" answer, through the real gateway
and store (docs/scheduling.md, "Plan and ETA")."""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import partial
from typing import Any

import pytest

from libs.domain.node.events import NodeRegistered
from libs.domain.node.model import GpuCard, NodeInventory
from libs.domain.reasons import ReasonCode
from libs.domain.task.decide import decide_pending_reason, decide_transition
from libs.domain.task.states import Actor, TaskStatus
from libs.store.projections import NODES

from .helpers import Api, complete

pytestmark = pytest.mark.integration

S = TaskStatus


def cards(node_id: str, n: int, vendor: str = "nvidia", model: str = "A100") -> tuple[GpuCard, ...]:
    return tuple(
        GpuCard(id=f"{node_id}-g{i}", index=i, vendor=vendor, model=model, vram_mb=40_960)
        for i in range(n)
    )


async def register(api: Api, node_id: str, gpus: tuple[GpuCard, ...]) -> None:
    inv = NodeInventory(memory_mb=65_536, cpu_cores=16, gpus=gpus, runtime="simulated")
    ev = NodeRegistered(node_id=node_id, inventory=inv)
    await api.store.execute_aggregate(NODES, node_id, lambda _n: [ev])


async def fleet(api: Api) -> None:
    """node-a: one nvidia card; node-b: two; node-c: two AMD cards."""
    await register(api, "node-a", cards("node-a", 1))
    await register(api, "node-b", cards("node-b", 2))
    await register(api, "node-c", cards("node-c", 2, vendor="amd", model="MI300X"))


async def event_count(api: Api) -> int:
    return len(await api.store.read_all(0, 1_000_000))


async def run_on(api: Api, task_id: str, node_id: str, gpus: tuple[str, ...]) -> None:
    """Walk a pending task to running on `node_id` holding `gpus`, as the scheduler would."""
    steps: list[tuple[TaskStatus, dict[str, Any]]] = [
        (S.SCHEDULED, {"node_id": node_id, "gpu_ids": gpus}),
        (S.STARTING, {}),
        (S.RUNNING, {}),
    ]
    for to, extra in steps:
        await api.store.execute(
            task_id,
            partial(
                decide_transition,
                to=to,
                actor=Actor.SCHEDULER,
                reason_code=ReasonCode.PLACED,
                **extra,
            ),
        )


TWO_CARDS: dict[str, Any] = {"name": "t", "image": "img:1", "gpu_required": 2, "gpu_type": "nvidia"}


async def test_a_plan_shows_the_node_it_lands_on_and_each_refusal_and_writes_nothing(
    api: Api,
) -> None:
    await fleet(api)
    before = await event_count(api)
    r = await api.client.post("/api/v1/tasks/plan", json=TWO_CARDS, headers=api.tenant)
    assert r.status_code == 200, r.text
    body = r.json()
    assert await event_count(api) == before  # nothing written
    assert body["written"] is False and body["fits"] is True
    (task,) = body["tasks"]
    assert task["outcome"] == "placed" and task["node_id"] == "node-b"
    assert task["gpu_ids"] == ["node-b-g0", "node-b-g1"]
    by_node = {n["node_id"]: n for n in task["nodes"]}
    assert by_node["node-b"]["fits"] is True
    assert by_node["node-a"] | {"message": ""} == {
        "node_id": "node-a",
        "fits": False,
        "stage": "whole_cards",
        "reason": "insufficient_gpus",
        "message": "",
    }
    assert (by_node["node-c"]["stage"], by_node["node-c"]["reason"]) == (
        "gpu_type",
        "gpu_type_unavailable",
    )
    assert task["nodes_more"] == 0 and task["nodes_fit"] == 1
    assert task["admission"]["admitted"] is True
    listed = await api.client.get("/api/v1/tasks", headers=api.tenant)
    assert listed.json()["total"] == 0


@pytest.mark.parametrize(
    ("create", "body"),
    [
        ("/api/v1/tasks", {"name": "t", "image": "img:1", "gpu_required": -1, "bogus": 1}),
        ("/api/v1/tasks", {"name": "t", "image": "img:1", "memory_mb": "lots"}),
        ("/api/v1/task-groups", {"name": "g", "image": "img:1", "task_count": 0}),
        (
            "/api/v1/jobs",
            {"name": "j", "tasks": [{"key": "a", "name": "a"}], "dependencies": [{"on": "z"}]},
        ),
    ],
    ids=["task-unknown-field", "task-bad-value", "group", "job"],
)
async def test_a_bad_body_is_refused_byte_for_byte_as_the_create_refuses_it(
    api: Api, create: str, body: dict[str, Any]
) -> None:
    before = await event_count(api)
    made = await api.client.post(create, json=body, headers=api.tenant)
    planned = await api.client.post(f"{create}/plan", json=body, headers=api.tenant)
    assert made.status_code == 400, made.text
    assert (planned.status_code, planned.content) == (made.status_code, made.content)
    raw = b'{"name": '
    made = await api.client.post(create, content=raw, headers=api.tenant)
    planned = await api.client.post(f"{create}/plan", content=raw, headers=api.tenant)
    assert (planned.status_code, planned.content) == (made.status_code, made.content)
    assert await event_count(api) == before


async def test_a_group_plan_places_every_member_and_a_job_plan_its_ready_tasks(api: Api) -> None:
    await fleet(api)
    before = await event_count(api)
    group = {
        "name": "g",
        "image": "img:1",
        "task_count": 3,
        "gpu_required": 1,
        "gpu_type": "nvidia",
    }
    r = await api.client.post("/api/v1/task-groups/plan", json=group, headers=api.tenant)
    assert r.status_code == 200, r.text
    placed = [t["node_id"] for t in r.json()["tasks"]]
    assert sorted(placed) == ["node-a", "node-b", "node-b"]
    job = {
        "name": "j",
        "tasks": [
            {"key": "a", "name": "a", "image": "img:1", "gpu_required": 4},
            {"key": "b", "name": "b", "image": "img:1"},
        ],
        "dependencies": [{"task": "b", "on": "a"}],
    }
    r = await api.client.post("/api/v1/jobs/plan", json=job, headers=api.tenant)
    assert r.status_code == 200, r.text
    (only,) = r.json()["tasks"]  # b is not ready: only a is planned
    assert only["outcome"] == "pending" and only["stage"] == "whole_cards"
    assert only["pending"]["eta"] == "unknown"  # no node has four cards: nothing frees them
    assert await event_count(api) == before


async def test_a_pending_task_says_what_binds_it_its_place_and_when_it_starts(api: Api) -> None:
    await fleet(api)
    spec = TWO_CARDS | {"timeout": 600}
    holder = (await api.client.post("/api/v1/tasks", json=spec, headers=api.tenant)).json()
    await run_on(api, holder["id"], "node-b", ("node-b-g0", "node-b-g1"))
    waiting = []
    for name in ("w1", "w2"):
        r = await api.client.post(
            "/api/v1/tasks", json=TWO_CARDS | {"name": name}, headers=api.tenant
        )
        waiting.append(r.json()["id"])
    for task_id in waiting:
        await api.store.execute(
            task_id,
            lambda t: decide_pending_reason(
                t, ReasonCode.INSUFFICIENT_GPUS, "no node has 2 free card(s)"
            ),
        )
    first = (await api.client.get(f"/api/v1/tasks/{waiting[0]}", headers=api.tenant)).json()
    second = (await api.client.get(f"/api/v1/tasks/{waiting[1]}", headers=api.tenant)).json()
    running = (await api.client.get(f"/api/v1/tasks/{holder['id']}", headers=api.tenant)).json()
    assert running["pending"] is None
    pending = first["pending"]
    assert (pending["stage"], pending["reason"], pending["position"]) == (
        "whole_cards",
        "insufficient_gpus",
        1,
    )
    assert pending["detail"] == "no node has 2 free card(s)"
    started = datetime.fromisoformat(running["started_at"])
    assert pending["eta"]["at"] == (started + timedelta(seconds=600)).isoformat()
    # The second waits behind the first: the two cards free once, and both need them.
    assert second["pending"]["position"] == 2
    assert second["pending"]["eta"] == "unknown"


async def test_the_eta_is_unknown_when_nothing_bounds_what_holds_the_cards(api: Api) -> None:
    await fleet(api)
    holder = (await api.client.post("/api/v1/tasks", json=TWO_CARDS, headers=api.tenant)).json()
    await run_on(api, holder["id"], "node-b", ("node-b-g0", "node-b-g1"))  # no timeout
    r = await api.client.post("/api/v1/tasks", json=TWO_CARDS | {"name": "w"}, headers=api.tenant)
    body = (await api.client.get(f"/api/v1/tasks/{r.json()['id']}", headers=api.tenant)).json()
    assert body["pending"]["eta"] == "unknown"
    assert "nothing bounds" in body["pending"]["method"]
    group = {
        "name": "g",
        "image": "img:1",
        "task_count": 1,
        "gpu_required": 2,
        "gpu_type": "nvidia",
    }
    made = (await api.client.post("/api/v1/task-groups", json=group, headers=api.tenant)).json()
    got = (await api.client.get(f"/api/v1/task-groups/{made['id']}", headers=api.tenant)).json()
    assert got["pending"]["eta"] == "unknown" and got["pending"]["tasks_pending"] == 1
    job = {"name": "j", "tasks": [TWO_CARDS | {"key": "a", "name": "a"}], "dependencies": []}
    made = (await api.client.post("/api/v1/jobs", json=job, headers=api.tenant)).json()
    got = (await api.client.get(f"/api/v1/jobs/{made['id']}", headers=api.tenant)).json()
    assert got["pending"]["eta"] == "unknown" and got["pending"]["position"] == 3


async def test_a_plan_names_the_work_it_would_preempt(api: Api) -> None:
    await fleet(api)
    low = TWO_CARDS | {"name": "low", "preemptible": True, "priority": 1}
    victim = (await api.client.post("/api/v1/tasks", json=low, headers=api.tenant)).json()
    await run_on(api, victim["id"], "node-b", ("node-b-g0", "node-b-g1"))
    before = await event_count(api)
    urgent = TWO_CARDS | {"name": "urgent", "priority": 50}
    r = await api.client.post("/api/v1/tasks/plan", json=urgent, headers=api.tenant)
    assert r.status_code == 200, r.text
    (task,) = r.json()["tasks"]
    assert task["outcome"] == "preempting", task
    assert task["preempts"] == [{"node_id": "node-b", "victims": [victim["id"]]}]
    assert await event_count(api) == before


async def test_the_place_in_line_follows_the_planners_order(api: Api) -> None:
    ids = []
    for name, priority in (("old", 0), ("new", 0), ("urgent", 9)):
        body = {"name": name, "image": "img:1", "priority": priority}
        ids.append(
            (await api.client.post("/api/v1/tasks", json=body, headers=api.tenant)).json()["id"]
        )
    got = []
    for task_id in ids:
        r = await api.client.get(f"/api/v1/tasks/{task_id}", headers=api.tenant)
        got.append(r.json()["pending"]["position"])
    assert got == [2, 3, 1]


async def test_a_typical_runtime_learned_from_finished_tasks_bounds_a_holder(api: Api) -> None:
    await fleet(api)
    for i in range(3):  # the tenant's finished tasks of the same image
        done = (
            await api.client.post(
                "/api/v1/tasks", json={"name": f"d{i}", "image": "img:1"}, headers=api.tenant
            )
        ).json()
        await complete(api.store, done["id"], "ok")
    holder = (await api.client.post("/api/v1/tasks", json=TWO_CARDS, headers=api.tenant)).json()
    await run_on(api, holder["id"], "node-b", ("node-b-g0", "node-b-g1"))  # no timeout
    r = await api.client.post("/api/v1/tasks", json=TWO_CARDS | {"name": "w"}, headers=api.tenant)
    body = (await api.client.get(f"/api/v1/tasks/{r.json()['id']}", headers=api.tenant)).json()
    assert body["pending"]["eta"] != "unknown", body["pending"]
    assert "runtime" in body["pending"]["method"]


async def test_a_plan_shows_the_variant_a_task_would_get_and_each_variants_nodes(api: Api) -> None:
    await fleet(api)
    body = {
        "name": "v",
        "image": "img:1",
        "variants": [
            {"gpu_type": "nvidia", "gpu_required": 4, "wait_s": 0},
            {"gpu_type": "amd", "gpu_required": 2},
        ],
    }
    r = await api.client.post("/api/v1/tasks/plan", json=body, headers=api.tenant)
    assert r.status_code == 200, r.text
    (task,) = r.json()["tasks"]
    assert (task["outcome"], task["variant"], task["node_id"]) == ("placed", 1, "node-c")
    first, second = task["variants"]
    assert first["nodes_fit"] == 0 and {n["stage"] for n in first["nodes"]} == {
        "whole_cards",
        "gpu_type",
    }
    assert second["nodes_fit"] == 1 and task["nodes"] == second["nodes"]


async def test_a_plan_and_a_pending_task_name_the_queue_and_quota_they_wait_on(api: Api) -> None:
    await fleet(api)
    pool = {"name": "all", "node_selector": {}}
    assert (await api.client.post("/api/v1/pools", json=pool, headers=api.operator)).is_success
    queue = {"name": "q", "tenant": "acme", "pools": ["all"], "quota": {"max_gpus": 2}}
    assert (await api.client.post("/api/v1/queues", json=queue, headers=api.operator)).is_success
    spec = TWO_CARDS | {"queue": "q", "timeout": 300}
    holder = (await api.client.post("/api/v1/tasks", json=spec, headers=api.tenant)).json()
    await run_on(api, holder["id"], "node-b", ("node-b-g0", "node-b-g1"))
    one = {"name": "one", "image": "img:1", "gpu_required": 1, "queue": "q"}
    r = await api.client.post("/api/v1/tasks/plan", json=one, headers=api.tenant)
    (task,) = r.json()["tasks"]
    admission = task["admission"]
    assert (admission["queue"], admission["admitted"], admission["reason"]) == (
        "q",
        False,
        "queue_quota_exceeded",
    )
    assert admission["queue_limits"]["max_gpus"] == 2 and admission["queue_used"]["gpus"] == 2
    assert (task["outcome"], task["stage"]) == ("pending", "queue_quota")
    started = datetime.fromisoformat(
        (await api.client.get(f"/api/v1/tasks/{holder['id']}", headers=api.tenant)).json()[
            "started_at"
        ]
    )
    assert task["pending"]["eta"]["at"] == (started + timedelta(seconds=300)).isoformat()
    assert task["pending"]["queue"] == "q" and task["pending"]["position"] == 1
