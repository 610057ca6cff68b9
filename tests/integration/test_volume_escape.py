"""A tenant cannot reach the host, nor another tenant's directory, through a volume: on a
real `heteroflow up` with a docker agent, the gateway refuses another tenant's directory at
create (400 naming the volume), and the agent resolves every bind source on its host at each
start: a symlink planted in the tenant's own directory (to `/`, through a parent, into
another tenant's directory) is refused naming the volume, and a symlink that stays inside is
mounted by its resolved path (what Docker is given)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from libs.store import groups as group_rows

from . import web
from .cluster import Cluster
from .conftest import requires_docker
from .helpers import Api

pytestmark = pytest.mark.integration

TENANT = "default"  # the tenant `heteroflow up` makes
BASE = Path("/tmp/heteroflow")


@pytest.fixture
def dirs() -> Iterator[tuple[Path, Path]]:
    """(a directory of the tenant's own, one of another tenant's), both under the default
    allow-list `/tmp/heteroflow/{tenant}`."""
    run = uuid.uuid4().hex[:8]
    mine, theirs = BASE / TENANT / f"esc-{run}", BASE / "globex" / f"esc-{run}"
    for d in (mine / "real", theirs):
        d.mkdir(parents=True)
    os.chmod(mine / "real", 0o777)
    (mine / "real" / "in.txt").write_text("mine\n")
    (theirs / "secret").write_text("theirs\n")
    yield mine, theirs
    shutil.rmtree(mine, ignore_errors=True)
    shutil.rmtree(theirs, ignore_errors=True)


def vol(host: Path | str) -> list[dict[str, str]]:
    return [{"host_path": str(host), "container_path": "/work"}]


def refused_by_the_node(cluster: Cluster, host: Path) -> str:
    t = cluster.create(command="cat /work/* ; ls /work", volumes=vol(host), max_retries=0)
    done = cluster.wait_status(t["id"], "failed", "completed")
    assert done["status"] == "failed", done
    assert "running" not in cluster.statuses(t["id"])
    return str(done["error"])


@pytest.mark.docker
@requires_docker
def test_symlinks_in_a_tenants_directory_do_not_leave_it(
    cluster: Cluster, dirs: tuple[Path, Path]
) -> None:
    mine, theirs = dirs
    cluster.start_agent("n1", runtime="docker")

    # Another tenant's directory: refused at create, naming the volume.
    r = web.post(
        f"{cluster.url}/api/v1/tasks",
        json={"name": "t", "image": "busybox:latest", "volumes": vol(theirs / "secret")},
        headers=cluster.tenant,
    )
    assert r.status_code == 400, r.text
    assert r.json()["fields"] == ["volumes.0.host_path"], r.text
    assert r.json()["code"] == 40003 and f"{BASE}/{TENANT})" in r.json()["error"], r.text

    # Symlinks a task could have planted there: the text is allowed, the node refuses.
    os.symlink("/", mine / "hostroot")
    os.symlink("/etc", mine / "up")
    os.symlink(theirs, mine / "theirs")
    why = refused_by_the_node(cluster, mine / "hostroot")
    assert why.startswith("InvalidConfig: refused by the node: volumes[0].host_path"), why
    assert f"{mine}/hostroot" in why and "resolves to '/'" in why, why
    why = refused_by_the_node(cluster, mine / "up" / "ssl")
    assert "resolves to '/etc/ssl'" in why, why
    why = refused_by_the_node(cluster, mine / "theirs")
    assert f"resolves to '{theirs}'" in why, why

    # A symlink that stays inside: mounted, by the path it resolves to.
    os.symlink(mine / "real", mine / "alias")
    t = cluster.create(command="cat /work/in.txt", volumes=vol(mine / "alias"), max_retries=0)
    done = cluster.wait_status(t["id"], "completed", "failed")
    assert done["status"] == "completed", done
    client = docker.from_env(timeout=10)
    try:
        found = client.containers.list(all=True, filters={"label": f"heteroflow.task_id={t['id']}"})
        assert found, "the completed task's container is kept"
        mounts = found[0].attrs["Mounts"]
    finally:
        client.close()
    assert [(m["Source"], m["Destination"]) for m in mounts] == [(str(mine / "real"), "/work")]


@pytest.mark.docker
@requires_docker
@pytest.mark.cluster_env(HETEROFLOW_VOLUME_ALLOW_LIST=f'["{BASE}"]')
def test_the_node_keeps_a_tenant_out_of_another_tenants_directory(
    cluster: Cluster, dirs: tuple[Path, Path]
) -> None:
    # The gateway allows the whole of /tmp/heteroflow; this node the tenant's own part only.
    mine, theirs = dirs
    cluster.start_agent(
        "n1", runtime="docker", HETEROFLOW_VOLUME_ALLOW_LIST=f'["{BASE}/{{tenant}}"]'
    )
    why = refused_by_the_node(cluster, theirs)
    assert f"'{theirs}' for tenant {TENANT} is not under" in why, why
    assert f"({BASE}/{TENANT})" in why, why
    # Its own directory still runs.
    t = cluster.create(command="cat /work/in.txt", volumes=vol(mine / "real"), max_retries=0)
    assert cluster.wait_status(t["id"], "completed", "failed")["status"] == "completed"


async def test_every_create_and_update_applies_the_tenants_part_of_the_list(api: Api) -> None:
    # The in-process gateway, its list made per tenant; `api.tenant` is tenant acme.
    api.settings.volume_allow_list = ["/data/{tenant}", "globex=/srv/globex"]
    theirs = [{"host_path": "/data/globex/set", "container_path": "/work"}]
    mine = [{"host_path": "/data/acme/set", "container_path": "/work"}]
    task = {"name": "t", "image": "busybox:latest"}
    group = {"name": "web", "image": "busybox:latest", "task_count": 1}
    job_task: dict[str, Any] = {"key": "a", "name": "a", "image": "busybox:latest"}

    async def post(path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
        return await api.client.post(path, json=body, headers=headers)

    def refused(r: Any, field: str = "volumes.0.host_path") -> bool:
        return bool(r.status_code == 400 and field in r.json()["fields"] and "/data/acme" in r.text)

    assert refused(await post("/api/v1/tasks", task | {"volumes": theirs}, api.tenant))
    srv = [{"host_path": "/srv/globex/x", "container_path": "/work"}]
    assert refused(await post("/api/v1/tasks", task | {"volumes": srv}, api.tenant))
    assert (
        await post("/api/v1/tasks", task | {"volumes": srv}, api.other_tenant)
    ).status_code == 201
    r = await post("/api/v1/task-groups", group | {"volumes": theirs}, api.tenant)
    assert refused(r), r.text
    job_theirs = {"name": "j", "tasks": [job_task | {"volumes": theirs}]}
    r = await post("/api/v1/jobs", job_theirs, api.tenant)
    assert r.status_code == 400 and "/data/globex/set" in r.text, r.text

    created = await post("/api/v1/tasks", task | {"volumes": mine}, api.tenant)
    assert created.status_code == 201, created.text
    r = await api.client.put(
        f"/api/v1/tasks/{created.json()['id']}", json={"volumes": theirs}, headers=api.tenant
    )
    assert refused(r), r.text

    made = await post("/api/v1/task-groups", group | {"volumes": mine}, api.tenant)
    assert made.status_code == 201, made.text
    gid = made.json()["id"]
    r = await post(f"/api/v1/task-groups/{gid}/rollout", {"volumes": theirs}, api.tenant)
    assert refused(r), r.text
    stored = await group_rows.get(api.store, gid)
    assert stored is not None and stored.rollout is None  # nothing started
    r = await post(f"/api/v1/task-groups/{gid}/rollout", {"volumes": mine}, api.tenant)
    assert r.status_code == 202, r.text
