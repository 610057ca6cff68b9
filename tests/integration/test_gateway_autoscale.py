"""`auto_scale` at group creation and `PUT /task-groups/{id}` (auto_scale, schedule_window),
against a real PostgreSQL: every refusal names its field with the SPEC §2 code, and every
accepted change is a group event that a replay folds the same way."""

from __future__ import annotations

from typing import Any

import pytest

from libs.domain.group.evolve import evolve_group
from libs.store import groups as group_rows
from libs.store.eventstore import payload_of

from .helpers import Api

pytestmark = pytest.mark.integration

CFG = {"metric": "qps", "target": 20, "max_replicas": 4}
BASE = {"name": "web", "image": "busybox:latest", "task_count": 1}


async def create(api: Api, **extra: Any) -> Any:
    return await api.client.post("/api/v1/task-groups", json=BASE | extra, headers=api.tenant)


async def test_auto_scale_at_creation_with_its_defaults(api: Api) -> None:
    r = await create(api, auto_scale=CFG)
    assert r.status_code == 201, r.text
    assert r.json()["auto_scale"] == {
        "metric": "qps",
        "target": 20.0,
        "min_replicas": 1,
        "max_replicas": 4,
        "cooldown_up_s": 60.0,
        "cooldown_down_s": 300.0,
    }
    assert r.json()["last_autoscale"] is None


REFUSED = [
    ("unknown metric", {"auto_scale": CFG | {"metric": "rps"}}, 40003, "auto_scale.metric"),
    ("target zero", {"auto_scale": CFG | {"target": 0}}, 40003, "auto_scale.target"),
    ("negative target", {"auto_scale": CFG | {"target": -1}}, 40003, "auto_scale.target"),
    (
        "min above max",
        {"auto_scale": CFG | {"min_replicas": 5, "max_replicas": 2}},
        40003,
        "auto_scale",
    ),
    (
        "max missing",
        {"auto_scale": {"metric": "qps", "target": 1}},
        40003,
        "auto_scale.max_replicas",
    ),
    ("max zero", {"auto_scale": CFG | {"max_replicas": 0}}, 40003, "auto_scale.max_replicas"),
    ("not an object", {"auto_scale": "qps"}, 40003, "auto_scale"),
    ("unknown field", {"auto_scale": CFG | {"step": 2}}, 40001, "auto_scale.step"),
    (
        "static world",
        {"auto_scale": CFG, "task_type": "training", "task_count": 2},
        40003,
        "auto_scale",
    ),
]


@pytest.mark.parametrize(
    ("body", "code", "field"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
async def test_bad_auto_scale_is_refused_at_creation(
    api: Api, body: dict[str, Any], code: int, field: str
) -> None:
    r = await create(api, **body)
    assert r.status_code == 400, r.text
    assert r.json()["code"] == code and field in r.json()["fields"], r.json()


async def put(api: Api, gid: str, body: Any) -> Any:
    return await api.client.put(f"/api/v1/task-groups/{gid}", json=body, headers=api.tenant)


async def test_put_sets_changes_and_removes_auto_scale_and_the_window(api: Api) -> None:
    gid = (await create(api)).json()["id"]
    window = {"start": "08:00", "end": "20:00", "action": "scale", "scale_to": 0}
    r = await put(api, gid, {"auto_scale": CFG, "schedule_window": window})
    assert r.status_code == 200, r.text
    assert r.json()["auto_scale"]["max_replicas"] == 4
    assert r.json()["schedule_window"]["scale_to"] == 0

    r = await put(api, gid, {"auto_scale": CFG | {"min_replicas": 2}, "idle_timeout_minutes": 5})
    assert r.status_code == 200, r.text
    assert r.json()["auto_scale"]["min_replicas"] == 2
    assert r.json()["schedule_window"]["scale_to"] == 0  # left out: unchanged
    assert r.json()["template"]["idle_timeout_minutes"] == 5

    r = await put(api, gid, {"auto_scale": None, "schedule_window": None})
    assert r.status_code == 200, r.text
    assert r.json()["auto_scale"] is None and r.json()["schedule_window"] is None

    # event-sourced: folding the group's stream gives the projection
    stored = await api.store.read_stream(gid)
    types = [e.type for e in stored]
    assert types.count("group_scaling_updated") == 3
    folded = None
    for e in stored:
        folded = evolve_group(folded, payload_of(e), e.occurred_at, e.version)
    assert folded == await group_rows.get(api.store, gid)


PUT_REFUSED = [
    ("unknown field", {"replicaz": 2}, 40001, "replicaz"),
    ("fixed at creation", {"image": "x"}, 40020, "image"),
    ("empty", {}, 40003, "auto_scale"),
    ("bad metric", {"auto_scale": CFG | {"metric": "x"}}, 40003, "auto_scale.metric"),
    ("min above max", {"auto_scale": CFG | {"min_replicas": 9}}, 40003, "auto_scale"),
    (
        "bad window time",
        {"schedule_window": {"start": "25:00", "end": "06:00", "action": "stop"}},
        40003,
        "schedule_window.start",
    ),
    (
        "window field unknown",
        {"schedule_window": {"start": "22:00", "end": "06:00", "action": "stop", "x": 1}},
        40001,
        "schedule_window.x",
    ),
    ("bad idle", {"idle_timeout_minutes": -1, "auto_scale": CFG}, 40003, "idle_timeout_minutes"),
    ("idle past int32", {"idle_timeout_minutes": 2**31}, 40003, "idle_timeout_minutes"),
]


@pytest.mark.parametrize(
    ("body", "code", "field"), [c[1:] for c in PUT_REFUSED], ids=[c[0] for c in PUT_REFUSED]
)
async def test_bad_updates_are_refused_and_write_nothing(
    api: Api, body: dict[str, Any], code: int, field: str
) -> None:
    gid = (await create(api)).json()["id"]
    before = len(await api.store.read_stream(gid))
    r = await put(api, gid, body)
    assert r.status_code == 400, r.text
    assert r.json()["code"] == code and field in r.json()["fields"], r.json()
    assert len(await api.store.read_stream(gid)) == before


async def test_a_static_world_group_takes_no_auto_scale_nor_a_scale_window(api: Api) -> None:
    r = await create(api, task_type="training", task_count=2)
    gid = r.json()["id"]
    r = await put(api, gid, {"auto_scale": CFG})
    assert r.status_code == 400 and r.json()["fields"] == ["auto_scale"], r.text
    window = {"start": "08:00", "end": "20:00", "action": "scale", "scale_to": 1}
    r = await put(api, gid, {"schedule_window": window})
    assert r.status_code == 400 and r.json()["code"] == 40003, r.text
    r = await put(api, gid, {"schedule_window": window | {"scale_to": 0}})
    assert r.status_code == 200, r.text


async def test_another_tenants_group_is_not_found(api: Api) -> None:
    gid = (await create(api)).json()["id"]
    r = await api.client.put(
        f"/api/v1/task-groups/{gid}", json={"auto_scale": CFG}, headers=api.other_tenant
    )
    assert r.status_code == 404 and r.json()["code"] == 40401, r.text
