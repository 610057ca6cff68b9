"""Rolling updates end to end: real busybox httpd replicas behind the router, the rollout
controller replacing them under load, rollback, canary, surge quota and holder recovery."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, cast

import httpx
import psycopg
import pytest

from libs.domain.rollout.decide import decide_drain
from libs.store.eventstore import EventStore

from . import web
from .cluster import BIN, TERMINAL, Cluster, TenantCalls, free_port
from .conftest import requires_docker
from .test_e2e_serving import (
    call,
    create_group,
    ready_replicas,
    serving,
    timeline_kinds,
)
from .test_split_processes import Split
from .test_split_processes import split as split  # noqa: F401 - the fixture, shared

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.docker, requires_docker]


def mark_draining(cluster: Cluster, task_id: str) -> None:
    async def run() -> None:
        store = await EventStore.open(cluster.database_url, max_size=2)
        try:
            await store.execute(task_id, decide_drain)
        finally:
            await store.close()

    asyncio.run(run())


def test_router_sends_nothing_new_to_a_draining_replica(cluster: Cluster) -> None:
    cluster.start_agent("sv1", "docker")
    g = create_group(cluster, task_count=2)
    cluster.wait(lambda: len(ready_replicas(cluster, g["id"])) == 2, "two ready replicas", 60)
    old, kept = sorted(ready_replicas(cluster, g["id"]))
    mark_draining(cluster, old)

    def drained() -> bool:
        return any(r["draining"] for r in serving(cluster, g["id"])["replicas"])

    cluster.wait(drained, "the router sees the draining mark", 30)
    served = set()
    for _ in range(20):
        r = call(cluster, g["id"], "index.html")
        assert r.status_code == 200, r.text
        served.add(r.headers["x-heteroflow-replica"])
    assert served == {kept}
    view = {r["task_id"]: r for r in serving(cluster, g["id"])["replicas"]}
    assert view[old]["status"] == "running" and view[old]["draining"]


# --- the rollout controller end to end -----------------------------------------------------

# A replica that serves its VERSION at /version; with BROKEN=yes its health path is missing.
VERSIONED = (
    "mkdir -p /tmp/www && "
    '{ [ "$BROKEN" = yes ] || echo ok > /tmp/www/healthz; } && '
    'echo "$VERSION" > /tmp/www/version && exec httpd -f -p 8000 -h /tmp/www'
)
FAST = {
    "HETEROFLOW_SERVE_METRICS_INTERVAL_S": "1",
    "HETEROFLOW_ROLLOUT_INTERVAL_S": "0.5",
    "HETEROFLOW_ROLLOUT_DRAIN_MIN_S": "1",
}


class Load(web.Repeat):
    """Requests through the router, one after another, until stopped."""

    def __init__(self, cluster: Cluster, target: str) -> None:
        super().__init__()
        self.cluster, self.target = cluster, target
        self.answers: list[tuple[int, str]] = []

    def once(self) -> None:
        try:
            r = call(self.cluster, self.target, "version")
            self.answers.append((r.status_code, r.text.strip()))
        except httpx.HTTPError as exc:
            self.answers.append((0, repr(exc)))

    def failures(self) -> list[tuple[int, str]]:
        return [a for a in self.answers if a[0] != 200]


def versioned_group(cluster: Cluster, task_count: int) -> dict[str, Any]:
    # Small replicas: old and new ones must fit together on a 2-core test node.
    return create_group(
        cluster,
        task_count=task_count,
        command=VERSIONED,
        env={"VERSION": "v1"},
        cpu_cores=0.25,
        memory_mb=128,
    )


def rollout(cluster: Cluster, group_id: str, action: str = "", **body: Any) -> dict[str, Any]:
    url = f"{cluster.url}/api/v1/task-groups/{group_id}/rollout" + (f"/{action}" if action else "")
    if action or body:
        r = web.post(url, json=body or None, headers=cluster.tenant)
        assert r.status_code in (200, 202), r.text
    else:
        r = web.get(url, headers=cluster.tenant)
    return dict(r.json())


def all_tasks(cluster: Cluster, group_id: str) -> list[dict[str, Any]]:
    """Every task of the group, replaced ones included (the group view lists its members)."""
    with psycopg.connect(cluster.database_url) as conn:
        rows = conn.execute("SELECT doc FROM tasks WHERE group_id = %s", (group_id,)).fetchall()
    return [dict(r[0]) for r in rows]


def live_by_generation(cluster: Cluster, group_id: str) -> dict[int, int]:
    tasks = all_tasks(cluster, group_id)
    return dict(Counter(t["generation"] for t in tasks if t["status"] not in TERMINAL))


def phase_is(cluster: Cluster, group_id: str, *phases: str) -> bool:
    return rollout(cluster, group_id)["phase"] in phases


@pytest.mark.cluster_env(**FAST)
def test_a_canary_then_a_full_rollout_under_load_fails_no_request(cluster: Cluster) -> None:
    cluster.start_agent("sv1", "docker")
    g = versioned_group(cluster, 3)
    gid = g["id"]
    cluster.wait(lambda: len(ready_replicas(cluster, gid)) == 3, "three ready replicas", 60)
    with Load(cluster, gid) as load:
        started = rollout(cluster, gid, env={"VERSION": "v2"}, partition=1)
        assert started["generation"] == 1 and started["phase"] == "running"

        def canary_done() -> bool:
            view = rollout(cluster, gid)
            return any(b["step"] == "done" for b in view["batches"])

        cluster.wait(canary_done, "the canary batch", 45)
        assert live_by_generation(cluster, gid) == {0: 2, 1: 1}  # exactly one v2 replica
        assert rollout(cluster, gid)["phase"] == "running"  # held at the partition
        rollout(cluster, gid, partition=3)
        cluster.wait(lambda: phase_is(cluster, gid, "completed", "failed"), "completion", 60)
        cluster.wait(lambda: call(cluster, gid, "version").text.strip() == "v2", "v2 only", 10)
    assert load.failures() == [], load.failures()[:5]
    assert {body for _, body in load.answers} <= {"v1", "v2"}
    assert len(load.answers) > 20  # the load ran throughout
    view = rollout(cluster, gid)
    assert view["phase"] == "completed", view
    assert [(b["number"], b["step"]) for b in view["batches"] if b["step"] == "done"] == [
        (1, "done"),
        (2, "done"),
        (3, "done"),
    ]
    assert {call(cluster, gid, "version").text.strip() for _ in range(12)} == {"v2"}
    tasks = all_tasks(cluster, gid)
    assert {t["status"] for t in tasks if t["generation"] == 0} == {"cancelled"}, [
        {k: t.get(k) for k in ("status", "exit_code", "error", "status_reason", "node_id")}
        for t in tasks
        if t["generation"] == 0 and t["status"] != "cancelled"
    ]
    assert sorted(t["rank"] for t in tasks if t["status"] == "running") == [0, 1, 2]
    kinds = timeline_kinds(cluster, gid)
    for kind in ("rollout_started", "rollout_batch", "rollout_drain", "rollout_completed"):
        assert kind in kinds, kinds


@pytest.mark.cluster_env(**FAST, HETEROFLOW_ROLLOUT_BATCH_RETRIES="1")
def test_a_rollout_whose_health_never_passes_rolls_back_and_v1_keeps_serving(
    cluster: Cluster,
) -> None:
    cluster.start_agent("sv1", "docker")
    g = versioned_group(cluster, 2)
    gid = g["id"]
    cluster.wait(lambda: len(ready_replicas(cluster, gid)) == 2, "two ready replicas", 60)
    v1 = {t["id"] for t in cluster.group(gid)["tasks"]}
    with Load(cluster, gid) as load:
        rollout(cluster, gid, env={"VERSION": "v2", "BROKEN": "yes"}, health_timeout_s=3)
        cluster.wait(lambda: phase_is(cluster, gid, "failed", "completed"), "the rollback", 60)
    assert load.failures() == [], load.failures()[:5]
    assert {body for _, body in load.answers} == {"v1"}
    view = rollout(cluster, gid)
    assert view["phase"] == "failed" and view["reason_code"] == "rollout_batch_failed", view
    assert "not running and healthy within 3s" in view["reason"]
    failed = [b["attempt"] for b in view["batches"] if b["step"] == "failed"]
    assert failed == [1, 2]  # the first try and one retry
    tasks = {t["id"]: t for t in all_tasks(cluster, gid)}
    assert all(tasks[t]["status"] == "running" and not tasks[t]["draining"] for t in v1)
    new = [t for t in tasks.values() if t["generation"] == 1]
    assert new and all(t["status"] in TERMINAL for t in new)
    assert "rollout_rollback" in timeline_kinds(cluster, gid)
    # Seed 000: the old configuration serves again, and the group is failed with the reason.
    seen = cluster.group(gid)
    assert (seen["status"], seen["reason_code"]) == ("failed", "rollout_batch_failed"), seen


def test_a_tenant_at_full_quota_completes_a_rollout_with_max_surge_1(cluster: Cluster) -> None:
    cluster.start_agent("q1", "process", HETEROFLOW_DECLARED_GPUS="amd:MI300X:196608x4")
    r = web.post(
        f"{cluster.url}/api/v1/task-groups",
        json={
            "name": "q",
            "image": "busybox:latest",
            "command": "sleep 300",
            "task_count": 2,
            "gpu_required": 1,
            "cpu_cores": 0.25,
            "memory_mb": 128,
            "env": {"VERSION": "v1"},
        },
        headers=cluster.tenant,
    )
    assert r.status_code == 201, r.text
    gid, tenant = r.json()["id"], r.json()["tenant_id"]
    r = web.put(
        f"{cluster.url}/api/v1/tenants/{tenant}", json={"gpu_quota": 2}, headers=cluster.operator
    )
    assert r.status_code == 200, r.text
    cluster.wait(lambda: live_by_generation(cluster, gid) == {0: 2}, "two replicas", 30)
    cluster.wait(
        lambda: all(t["status"] == "running" for t in cluster.group(gid)["tasks"]), "running", 30
    )
    url = f"{cluster.url}/api/v1/task-groups/{gid}/rollout"
    r = web.post(url, json={"env": {"VERSION": "v2"}, "max_surge": 3}, headers=cluster.tenant)
    assert r.status_code == 400 and r.json()["fields"] == ["max_surge"], r.text
    assert "surge allowance" in r.json()["error"]
    rollout(cluster, gid, env={"VERSION": "v2"}, max_surge=1)
    cluster.wait(lambda: phase_is(cluster, gid, "completed", "failed"), "completion", 60)
    assert rollout(cluster, gid)["phase"] == "completed"
    running = [t for t in all_tasks(cluster, gid) if t["status"] == "running"]
    assert (
        sorted((t["generation"], t["spec"]["env"]["VERSION"]) for t in running) == [(1, "v2")] * 2
    )


@pytest.mark.cluster_env(**FAST)
def test_recreate_stops_the_old_training_world_before_starting_the_new_one(
    cluster: Cluster,
) -> None:
    # Two nodes of one card each: the fixed world fills them, so a new world started beside
    # the old one could never be placed.
    for node in ("a", "b"):
        cluster.start_agent(node, "process", HETEROFLOW_DECLARED_GPUS="nvidia:A100:81920")
    body = {
        "name": "train",
        "image": "busybox:latest",
        "task_type": "training",
        "task_count": 2,
        "per_node_gpu": 1,
        "command": "sleep 300",
        "env": {"VERSION": "v1"},
        "cpu_cores": 0.25,
        "memory_mb": 128,
    }
    r = web.post(f"{cluster.url}/api/v1/task-groups", json=body, headers=cluster.tenant)
    assert r.status_code == 201, r.text
    gid = r.json()["id"]
    cluster.wait(
        lambda: all(t["status"] == "running" for t in cluster.group(gid)["tasks"]), "running", 60
    )
    url = f"{cluster.url}/api/v1/task-groups/{gid}/rollout"
    r = web.post(url, json={"env": {"VERSION": "v2"}}, headers=cluster.tenant)
    assert r.status_code == 400 and r.json()["fields"] == ["strategy"], r.text  # a restart
    rollout(cluster, gid, env={"VERSION": "v2"}, strategy="recreate", health_timeout_s=60)
    cluster.wait(lambda: phase_is(cluster, gid, "completed", "failed"), "completion", 60)
    view = rollout(cluster, gid)
    assert view["phase"] == "completed", view
    assert [b["step"] for b in view["batches"]] == ["down", "started", "ready", "drain", "done"]
    tasks = all_tasks(cluster, gid)
    old = [t for t in tasks if t["generation"] == 0]
    new = [t for t in tasks if t["generation"] == 1]
    assert {t["status"] for t in old} == {"cancelled"} and len(new) == 2
    assert all(t["status"] == "running" and t["spec"]["env"]["VERSION"] == "v2" for t in new)
    # The whole old world had ended before any member of the new one was even created.
    assert max(t["finished_at"] for t in old) <= min(t["created_at"] for t in new)


@pytest.mark.cluster_env(
    **FAST,
    HETEROFLOW_ROLLOUT_IN_UP="false",
    HETEROFLOW_ROLLOUT_LEASE_RENEW_S="1",
    HETEROFLOW_ROLLOUT_LEASE_TTL_S="5",
)
def test_a_killed_rollout_service_is_recovered_and_a_new_rollout_succeeds(
    cluster: Cluster,
) -> None:
    cluster.start_agent("sv1", "docker")
    g = versioned_group(cluster, 2)
    gid = g["id"]
    first = start_rollout_service(cluster)
    second: subprocess.Popen[bytes] | None = None
    try:
        cluster.wait(lambda: len(ready_replicas(cluster, gid)) == 2, "two ready replicas", 60)
        # v2 never turns healthy within the (long) timeout: the rollout is mid-batch.
        rollout(cluster, gid, env={"VERSION": "v2", "BROKEN": "yes"}, health_timeout_s=600)

        def held_mid_batch() -> bool:
            view = rollout(cluster, gid)
            return bool(view["holder"]) and any(b["step"] == "started" for b in view["batches"])

        cluster.wait(held_mid_batch, "the rollout held mid-batch", 30)
        first_holder = rollout(cluster, gid)["holder"]
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        killed = time.monotonic()
        second = start_rollout_service(cluster)
        cluster.wait(lambda: phase_is(cluster, gid, "failed"), "the recovery scan", 30)
        assert time.monotonic() - killed < 30
        view = rollout(cluster, gid)
        assert view["reason_code"] == "rollout_holder_lost", view
        assert "stopped renewing" in view["reason"] and "submit a new rollout" in view["reason"]
        # The 5 s TTL, not the seed's 60 s: the setting is the lease's expiry.
        assert "lease TTL 5s" in view["reason"], view
        assert view["holder"] not in ("", first_holder), view  # the second took it over
        seen = cluster.group(gid)  # the group itself is failed with the reason
        assert (seen["status"], seen["reason_code"]) == ("failed", "rollout_holder_lost"), seen
        again = rollout(cluster, gid, env={"VERSION": "v3"})
        assert again["generation"] == 2
        cluster.wait(lambda: phase_is(cluster, gid, "completed", "failed"), "completion", 60)
        assert rollout(cluster, gid)["phase"] == "completed"
        assert live_by_generation(cluster, gid) == {2: 2}
        cluster.wait(lambda: call(cluster, gid, "version").text.strip() == "v3", "v3 serving", 10)
        cluster.wait(lambda: cluster.group(gid)["status"] == "running", "group running", 30)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)


@pytest.mark.cluster_env(
    **FAST,
    HETEROFLOW_ROLLOUT_IN_UP="false",
    HETEROFLOW_ROLLOUT_LEASE_RENEW_S="1",
    # Far beyond the test's waits: only a handed-over lease lets the second instance act.
    HETEROFLOW_ROLLOUT_LEASE_TTL_S="600",
)
def test_a_gracefully_stopped_rollout_service_hands_its_rollout_over(cluster: Cluster) -> None:
    cluster.start_agent("sv1", "docker")
    g = versioned_group(cluster, 2)
    gid = g["id"]
    first = start_rollout_service(cluster)
    second: subprocess.Popen[bytes] | None = None
    try:
        cluster.wait(lambda: len(ready_replicas(cluster, gid)) == 2, "two ready replicas", 60)
        rollout(cluster, gid, env={"VERSION": "v2"}, partition=1)

        def held() -> bool:
            view = rollout(cluster, gid)
            return bool(view["holder"]) and any(b["step"] == "started" for b in view["batches"])

        cluster.wait(held, "the rollout held by the first instance", 30)
        first_holder = rollout(cluster, gid)["holder"]
        first.send_signal(signal.SIGTERM)
        assert first.wait(30) == 0
        view = rollout(cluster, gid)
        assert view["holder"] == "" and view["phase"] == "running", view  # handed over
        second = start_rollout_service(cluster)
        rollout(cluster, gid, partition=2)
        cluster.wait(lambda: phase_is(cluster, gid, "completed", "failed"), "completion", 60)
        view = rollout(cluster, gid)
        assert view["phase"] == "completed", view
        assert view["holder"] not in ("", first_holder), view  # the second instance resumed it
        assert [b["number"] for b in view["batches"] if b["step"] == "done"] == [1, 2]
        assert live_by_generation(cluster, gid) == {1: 2}
        cluster.wait(lambda: call(cluster, gid, "version").text.strip() == "v2", "v2 serving", 10)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)


# A drain that lasts (no early end): the old replica is caught running and draining.
LONG_DRAIN = FAST | {
    "HETEROFLOW_ROLLOUT_DRAIN_MIN_S": "10",
    "HETEROFLOW_ROLLOUT_DRAIN_TIMEOUT_S": "10",
}


@pytest.mark.cluster_env(**LONG_DRAIN)
def test_generation_and_draining_survive_a_restart_of_the_whole_platform(
    cluster: Cluster,
) -> None:
    cluster.start_agent("sv1", "docker")
    g = versioned_group(cluster, 2)
    gid = g["id"]
    cluster.wait(lambda: len(ready_replicas(cluster, gid)) == 2, "two ready replicas", 60)
    rollout(cluster, gid, env={"VERSION": "v2"}, partition=1)

    def draining() -> bool:
        return any(b["step"] == "drain" for b in rollout(cluster, gid)["batches"])

    cluster.wait(draining, "the canary's old replica draining", 45)
    rollout(cluster, gid, "pause")  # held mid-drain: nothing ends while paused
    before = task_fields(cluster, gid)
    assert sorted(before.values()) == [
        (0, False, "running"),
        (0, True, "running"),
        (1, False, "running"),
    ]

    # The whole control plane (API, scheduler, controllers, rollout) stops and starts again;
    # all it knows afterwards comes from PostgreSQL.
    assert cluster.control is not None
    cluster.control.send_signal(signal.SIGTERM)
    cluster.control.wait(60)
    cluster.start(**LONG_DRAIN)

    assert task_fields(cluster, gid) == before  # read back through the API
    view = rollout(cluster, gid)
    assert (view["generation"], view["phase"]) == (1, "paused"), view
    assert view["replicas"] == [
        {"generation": 0, "live": 2, "draining": 1},
        {"generation": 1, "live": 1, "draining": 0},
    ]
    # The router of the new platform still sends the draining replica nothing new.
    drained = next(t for t, f in before.items() if f[1])

    def router_sees_drain() -> bool:
        replicas = serving(cluster, gid)["replicas"]
        return any(r["task_id"] == drained and r["draining"] for r in replicas)

    cluster.wait(router_sees_drain, "the new router knows the drain mark", 30)
    served = {call(cluster, gid, "version").headers["x-heteroflow-replica"] for _ in range(10)}
    assert served and drained not in served
    # ... and the rollout carries on where it stopped.
    rollout(cluster, gid, "resume")
    rollout(cluster, gid, partition=2)
    cluster.wait(lambda: phase_is(cluster, gid, "completed", "failed"), "completion", 90)
    assert rollout(cluster, gid)["phase"] == "completed"
    assert live_by_generation(cluster, gid) == {1: 2}
    assert task_fields(cluster, gid)[drained] == (0, True, "cancelled")


def task_fields(cluster: Cluster, group_id: str) -> dict[str, tuple[int, bool, str]]:
    """(generation, draining, status) of every task of the group, as the API shows each."""
    out = {}
    for t in all_tasks(cluster, group_id):
        r = web.get(f"{cluster.url}/api/v1/tasks/{t['id']}", headers=cluster.tenant)
        assert r.status_code == 200, r.text
        view = r.json()
        out[t["id"]] = (view["generation"], view["draining"], view["status"])
    return out


@dataclass
class SplitPlatform(TenantCalls):
    url: str
    database_url: str
    key: str

    @property
    def tenant(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


def test_a_rollout_under_load_with_every_service_its_own_process(split: Split) -> None:  # noqa: F811
    """`heteroflow up --processes`: the router in the api-gateway process, the controller in
    the rollout process, the replicas on the local agent's Docker engine."""
    split.wait(split.all_ready, "every child process ready", timeout=90)
    key = json.loads((split.home / "credentials.json").read_text())["tenant_api_key"]
    # The helpers above need only the tenant's calls and the database of a Cluster.
    plat = cast(Cluster, SplitPlatform(split.url, split.database_url, key))
    g = versioned_group(plat, 2)
    gid = g["id"]
    split.wait(lambda: len(ready_replicas(plat, gid)) == 2, "two ready replicas", 90)
    with Load(plat, gid) as load:
        rollout(plat, gid, env={"VERSION": "v2"})
        split.wait(lambda: phase_is(plat, gid, "completed", "failed"), "completion", 90)
        split.wait(lambda: call(plat, gid, "version").text.strip() == "v2", "v2 only", 15)
    assert rollout(plat, gid)["phase"] == "completed"
    assert load.failures() == [], load.failures()[:5]
    assert {body for _, body in load.answers} <= {"v1", "v2"} and len(load.answers) > 20
    tasks = all_tasks(plat, gid)
    assert {t["status"] for t in tasks if t["generation"] == 0} == {"cancelled"}
    assert live_by_generation(plat, gid) == {1: 2}


def start_rollout_service(cluster: Cluster) -> subprocess.Popen[bytes]:
    log = open(cluster.root / "rollout.log", "ab")  # noqa: SIM115 - the child owns it
    env = cluster.env | {"HETEROFLOW_METRICS_PORT": str(free_port())}
    return subprocess.Popen(
        [str(BIN), "service", "rollout"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
