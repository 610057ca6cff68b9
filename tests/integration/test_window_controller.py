"""The schedule-window controller against a real PostgreSQL, with a test clock: scale to 0
and back (across a controller restart), pause then wake, stop stays stopped."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pytest

from libs.domain.errors import Fenced
from libs.domain.reasons import ReasonCode
from libs.domain.task.decide import decide_transition
from libs.domain.task.states import Actor, TaskStatus
from libs.store.fenced import FencedWriter
from libs.store.fencing import Fence
from services.autoscaler.controllers.windows import WindowController

from .helpers import Api

pytestmark = pytest.mark.integration


def writer(api: Api) -> FencedWriter:
    """A leader's writer under a lease of its own (a term no other test contends for)."""
    return FencedWriter(api.store, Fence(f"test-{uuid.uuid4().hex[:8]}", 1))


NOON = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)  # outside 22:00-06:00
NIGHT = datetime(2026, 1, 5, 23, 0, tzinfo=UTC)  # inside


async def make_group(api: Api, action: dict[str, Any]) -> str:
    body = {"name": "web", "image": "busybox:latest", "task_count": 2}
    body["schedule_window"] = {"start": "22:00", "end": "06:00"} | action
    r = await api.client.post("/api/v1/task-groups", json=body, headers=api.tenant)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def view(api: Api, gid: str) -> dict[str, Any]:
    r = await api.client.get(f"/api/v1/task-groups/{gid}", headers=api.tenant)
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


async def test_scale_to_zero_and_back_across_a_restart(api: Api) -> None:
    gid = await make_group(api, {"action": "scale", "scale_to": 0})
    assert (
        await WindowController(api.store, lambda: NIGHT).scan(writer(api)) == 0
    )  # inside: nothing

    assert await WindowController(api.store, lambda: NOON).scan(writer(api)) == 1
    g = await view(api, gid)
    assert g["replicas"] == 0
    assert g["group_labels"] == {
        "heteroflow.window.action": "scale",
        "heteroflow.window.original_replicas": "2",
    }
    assert {t["status"] for t in g["tasks"]} == {"cancelled"}
    assert await WindowController(api.store, lambda: NOON).scan(writer(api)) == 0  # in force: once

    # a new controller (process restart) reads the count to restore from the label
    assert await WindowController(api.store, lambda: NIGHT).scan(writer(api)) == 1
    g = await view(api, gid)
    assert g["replicas"] == 2 and g["group_labels"] == {}
    assert [(t["rank"], t["status"]) for t in g["tasks"]] == [(0, "pending"), (1, "pending")]


async def test_pause_sleeps_then_wakes(api: Api) -> None:
    gid = await make_group(api, {"action": "pause"})
    await run_members(api, gid)
    ctl = WindowController(api.store, lambda: NOON)
    assert await ctl.scan(writer(api)) == 1
    g = await view(api, gid)
    assert {t["status"] for t in g["tasks"]} == {"sleeping"} and g["replicas"] == 2
    ctl.clock = lambda: NIGHT
    assert await ctl.scan(writer(api)) == 1
    g = await view(api, gid)
    assert {t["status"] for t in g["tasks"]} == {"waking"} and g["group_labels"] == {}


async def test_stop_stays_stopped(api: Api) -> None:
    gid = await make_group(api, {"action": "stop"})
    await run_members(api, gid)
    ctl = WindowController(api.store, lambda: NOON)
    assert await ctl.scan(writer(api)) == 1
    assert {t["status"] for t in (await view(api, gid))["tasks"]} == {"stopping"}
    ctl.clock = lambda: NIGHT
    assert await ctl.scan(writer(api)) == 0
    g = await view(api, gid)
    assert {t["status"] for t in g["tasks"]} == {"stopping"}
    assert g["group_labels"]["heteroflow.window.action"] == "stop"


async def test_a_deposed_leader_is_refused_by_the_fence(api: Api) -> None:
    gid = await make_group(api, {"action": "scale", "scale_to": 0})
    old = WindowController(api.store, lambda: NOON)
    await api.store.claim_fence(Fence("schedule-windows", 2))  # a newer leader was elected
    with pytest.raises(Fenced):
        await old.scan(FencedWriter(api.store, Fence("schedule-windows", 1)))
    g = await view(api, gid)
    assert g["replicas"] == 2 and g["group_labels"] == {}
    assert {t["status"] for t in g["tasks"]} == {"pending"}
