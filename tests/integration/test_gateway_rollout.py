"""The rollout API over a real PostgreSQL: validation, generation CAS, pause/resume/rollback."""

from __future__ import annotations

from typing import Any

import pytest

from libs.store import groups as group_rows

from .helpers import Api

pytestmark = pytest.mark.integration

BASE = {"name": "web", "image": "busybox:v1", "task_count": 3, "env": {"A": "1"}}


async def group(api: Api, **kw: Any) -> str:
    r = await api.client.post("/api/v1/task-groups", json=BASE | kw, headers=api.tenant)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def post(api: Api, gid: str, tail: str = "", body: Any = None) -> Any:
    url = f"/api/v1/task-groups/{gid}/rollout{tail}"
    return await api.client.post(url, json=body if body is not None else {}, headers=api.tenant)


async def test_rollout_raises_the_generation_and_refuses_a_second(api: Api) -> None:
    gid = await group(api)
    r = await post(api, gid, body={"image": "busybox:v2", "max_surge": 2})
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["generation"] == 1 and body["phase"] == "running"
    assert body["rollout_id"].startswith("ro-") and body["request"]["max_surge"] == 2
    assert body["replicas"] == [{"generation": 0, "live": 3, "draining": 0}]
    stored = await group_rows.get(api.store, gid)
    assert stored is not None and stored.rollout is not None
    # Intent inherited: only the image changed in the target template.
    assert stored.rollout.target.image == "busybox:v2" and stored.rollout.target.env == {"A": "1"}
    assert stored.rollout.previous.image == "busybox:v1"

    again = await post(api, gid, body={"image": "busybox:v3"})
    assert again.status_code == 400 and again.json()["code"] == 40030, again.text
    canary = await post(api, gid, body={"partition": 3})
    assert canary.status_code == 202 and canary.json()["request"]["partition"] == 3

    assert (await post(api, gid, "/resume")).json()["code"] == 40030
    assert (await post(api, gid, "/pause")).json()["phase"] == "paused"
    assert (await post(api, gid, "/resume")).json()["phase"] == "running"
    assert (await post(api, gid, "/rollback")).json()["phase"] == "rollback"
    got = await api.client.get(f"/api/v1/task-groups/{gid}/rollout", headers=api.tenant)
    assert got.status_code == 200 and got.json()["generation"] == 1


async def test_bad_rollouts_name_what_is_wrong(api: Api) -> None:
    gid = await group(api)
    r = await post(api, gid, body={"image": "busybox:v2", "imag": "x", "surge": 1})
    assert r.status_code == 400 and r.json()["code"] == 40001
    assert r.json()["fields"] == ["imag", "surge"]
    r = await post(api, gid, body={"image": "busybox:v2", "max_surge": -1})
    assert r.status_code == 400 and r.json()["fields"] == ["max_surge"]
    training = await group(api, task_type="training", gpu_required=0)
    r = await post(api, training, body={"image": "busybox:v2"})
    assert r.status_code == 400 and r.json()["fields"] == ["strategy"]
    assert "recreate" in r.json()["error"]
    other = await api.client.post(
        f"/api/v1/task-groups/{gid}/rollout", json={"image": "x"}, headers=api.other_tenant
    )
    assert other.status_code == 404
    assert (await post(api, "grp-missing", body={"image": "x"})).status_code == 404
