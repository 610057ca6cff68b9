"""Task groups end to end: gang placement and env, replica self-heal, static-world failure,
whole-group restart and inference rebuild, on real agent processes."""

from __future__ import annotations

import os
import signal
from typing import Any

import psycopg
import pytest

from . import web
from .cluster import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ENV_PROBE = (
    "echo WORLD_SIZE=$WORLD_SIZE NNODES=$NNODES NODE_RANK=$NODE_RANK "
    "LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT "
    "DIST_BACKEND=$DIST_BACKEND RANK=${RANK-unset} MINE=$MINE"
)


def create_group(cluster: Cluster, **body: Any) -> dict[str, Any]:
    body = {"name": "grp", "image": "busybox:latest"} | body
    return cluster.create_group(**body)


def group_payloads(cluster: Cluster, group_id: str, event_type: str) -> list[dict[str, Any]]:
    with psycopg.connect(cluster.database_url) as conn:
        rows = conn.execute(
            "SELECT payload FROM events WHERE stream_id = %s AND type = %s ORDER BY version",
            (group_id, event_type),
        ).fetchall()
    return [r[0] for r in rows]


def group_statuses(cluster: Cluster, group_id: str) -> list[str]:
    return [p["to_status"] for p in group_payloads(cluster, group_id, "group_status_changed")]


def recoveries(cluster: Cluster, group_id: str) -> list[str]:
    return [p["kind"] for p in group_payloads(cluster, group_id, "group_recovery")]


def test_training_group_is_a_gang_with_consistent_env(cluster: Cluster) -> None:
    cluster.start_agent(
        "a", "process", HETEROFLOW_DECLARED_GPUS="nvidia:A100:81920", HETEROFLOW_ADDRESS="10.1.0.1"
    )
    g = create_group(
        cluster,
        task_count=2,
        task_type="training",
        per_node_gpu=1,
        anti_affinity="world",
        command=ENV_PROBE + "; sleep 1",
        env={"MINE": "kept", "MASTER_PORT": "4000"},
    )
    # One node with one card: the world cannot form, so neither member runs.
    cluster.wait(
        lambda: all(t["pending_reason"] for t in cluster.group(g["id"])["tasks"]),
        "both members explain why they wait",
    )
    assert {t["status"] for t in cluster.group(g["id"])["tasks"]} == {"pending"}
    cluster.start_agent(
        "b", "process", HETEROFLOW_DECLARED_GPUS="nvidia:A100:81920", HETEROFLOW_ADDRESS="10.1.0.2"
    )
    cluster.wait(
        lambda: cluster.group(g["id"])["status"] == "completed", "group completed", timeout=40
    )
    members = cluster.group(g["id"])["tasks"]
    rank0_node = next(t["node_id"] for t in members if t["rank"] == 0)
    master = {"a": "10.1.0.1", "b": "10.1.0.2"}[rank0_node]
    for t in members:
        (line,) = [x for x in cluster.logs(t["id"]) if x.startswith("WORLD_SIZE")]
        assert line == (
            f"WORLD_SIZE=2 NNODES=2 NODE_RANK={t['rank']} LOCAL_WORLD_SIZE=1 "
            f"MASTER_ADDR={master} MASTER_PORT=4000 DIST_BACKEND=nccl "
            f"RANK={t['rank']} MINE=kept"
        )
    assert len({t["node_id"] for t in members}) == 2


def test_killing_one_replica_heals_only_that_rank(cluster: Cluster) -> None:
    cluster.start_agent("a", "process")
    cluster.start_agent("b", "process")
    g = create_group(cluster, task_count=2, parallelism="split", command="sleep 300")
    cluster.wait(lambda: cluster.group(g["id"])["status"] == "running", "group running")
    members = {t["rank"]: t for t in cluster.group(g["id"])["tasks"]}
    victim, healthy = members[0], members[1]
    os.kill(int(victim["container_id"]), signal.SIGKILL)

    def replaced() -> bool:
        now = {t["rank"]: t for t in cluster.group(g["id"])["tasks"]}
        return bool(now[0]["id"] != victim["id"] and now[0]["status"] == "running")

    cluster.wait(replaced, "a new running task for rank 0", timeout=40)
    after = cluster.group(g["id"])
    assert after["status"] == "running" and after["replacements"] == 1
    assert victim["id"] in after["superseded_tasks"]
    untouched = cluster.task(healthy["id"])
    assert untouched["status"] == "running" and untouched["version"] == healthy["version"]
    assert group_statuses(cluster, g["id"]) == ["running"], "never left running"
    assert cluster.task(victim["id"])["status"] == "failed"


def test_static_world_member_failure_fails_group_and_stops_the_rest(cluster: Cluster) -> None:
    cluster.start_agent("a", "process")
    cluster.start_agent("b", "process")
    g = create_group(
        cluster,
        task_count=2,
        task_type="training",
        command='if [ "$NODE_RANK" = 1 ]; then sleep 2; exit 3; fi; sleep 300',
    )
    cluster.wait(lambda: cluster.group(g["id"])["status"] == "failed", "group failed", timeout=40)
    members = {t["rank"]: t for t in cluster.group(g["id"])["tasks"]}
    assert members[1]["status"] == "failed" and members[1]["retry_count"] == 0
    cluster.wait(lambda: cluster.task(members[0]["id"])["status"] == "stopped", "rank 0 stopped")
    assert "group_restart" not in recoveries(cluster, g["id"]), "a user error vetoes restarts"


@pytest.mark.cluster_env(HETEROFLOW_GROUP_RESTART_BACKOFFS_S="[1, 2]")
def test_startup_infra_failure_restarts_whole_group_at_most_twice(cluster: Cluster) -> None:
    cluster.start_agent("a", "process")
    cluster.start_agent("b", "process")
    g = create_group(
        cluster,
        task_count=2,
        task_type="training",
        command="echo 'connect: connection timed out' >&2; exit 1",
    )

    def settled() -> bool:
        group = cluster.group(g["id"])
        return (
            group["restarts"] == 2
            and group["status"] == "failed"
            and all(t["status"] == "failed" for t in group["tasks"])
        )

    cluster.wait(settled, "two restarts, then failed", timeout=60)
    group = cluster.group(g["id"])
    assert len(group["superseded_tasks"]) == 4, "two earlier worlds of two members"
    kinds = recoveries(cluster, g["id"])
    assert kinds.count("group_restart") == 2
    assert kinds == ["restart_scheduled", "group_restart", "restart_scheduled", "group_restart"]


@pytest.mark.cluster_env(HETEROFLOW_GROUP_REBUILD_SCAN_S="1")
def test_inference_group_rebuilt_at_priority_100_at_most_five_times(cluster: Cluster) -> None:
    cluster.start_agent("a", "process")
    g = create_group(cluster, task_count=1, task_type="inference", command="exit 1")

    def settled() -> bool:
        group = cluster.group(g["id"])
        return bool(group["rebuilds"] == 5 and group["status"] == "failed")

    cluster.wait(settled, "five rebuilds then failed", timeout=90)
    group = cluster.group(g["id"])
    assert len(group["superseded_tasks"]) == 5
    assert group["tasks"][0]["priority"] == 100
    assert recoveries(cluster, g["id"]).count("inference_rebuild") == 5


@pytest.mark.cluster_env(HETEROFLOW_GROUP_REBUILD_SCAN_S="1")
def test_tensor_parallel_inference_world_is_stopped_and_rebuilt_whole_at_priority_100(
    cluster: Cluster,
) -> None:
    cluster.start_agent("a", "process")
    g = create_group(
        cluster,
        task_count=2,
        task_type="inference",
        parallelism="tensor_parallel",
        tensor_parallel_size=2,
        command="sleep 300",
    )

    def world() -> dict[int, dict[str, Any]]:
        return {t["rank"]: t for t in cluster.group(g["id"])["tasks"]}

    cluster.wait(lambda: all(t["status"] == "running" for t in world().values()), "world up")
    old = world()
    assert len(old) == 2 and {t["priority"] for t in old.values()} == {0}
    os.kill(int(old[1]["container_id"]), signal.SIGKILL)  # one rank of the world dies

    def rebuilt() -> bool:
        now = world()
        return all(now[k]["id"] != old[k]["id"] and now[k]["status"] == "running" for k in (0, 1))

    cluster.wait(rebuilt, "the whole world rebuilt and running", timeout=60)
    new = world()
    assert {t["priority"] for t in new.values()} == {100}
    cluster.wait(lambda: cluster.group(g["id"])["status"] == "running", "group running", 30)
    group = cluster.group(g["id"])
    assert group["rebuilds"] == 1, group
    assert {old[0]["id"], old[1]["id"]} <= set(group["superseded_tasks"])
    # The live rank was stopped by the group (never failed itself), the dead one failed.
    ended = {k: cluster.task(old[k]["id"]) for k in (0, 1)}
    assert (ended[0]["status"], ended[1]["status"]) == ("stopped", "failed"), ended
    # Rebuilt as one world: no new rank existed while a rank of the old one was live.
    assert max(t["finished_at"] for t in ended.values()) <= min(
        t["created_at"] for t in new.values()
    )
    assert recoveries(cluster, g["id"]) == ["inference_rebuild"]


def test_group_api_validation_and_membership(cluster: Cluster) -> None:
    r = web.post(
        f"{cluster.url}/api/v1/tasks",
        headers=cluster.tenant,
        json={"name": "x", "image": "busybox", "group_id": "grp-1", "rank": 1},
    )
    assert r.status_code == 400 and r.json()["code"] == 40002
    r = web.post(
        f"{cluster.url}/api/v1/task-groups",
        headers=cluster.tenant,
        json={"name": "x", "image": "busybox", "task_count": 2, "parallelism": "x"},
    )
    assert r.status_code == 400 and r.json()["code"] == 40003
    g = create_group(cluster, task_count=3, command="sleep 30")
    assert [t["rank"] for t in g["tasks"]] == [0, 1, 2]
    r = web.put(
        f"{cluster.url}/api/v1/task-groups/{g['id']}",
        headers=cluster.tenant,
        json={"idle_timeout_minutes": 12},
    )
    assert r.status_code == 200 and r.json()["template"]["idle_timeout_minutes"] == 12
    assert {t["idle_timeout_minutes"] for t in r.json()["tasks"]} == {12}
    r = web.put(
        f"{cluster.url}/api/v1/task-groups/{g['id']}",
        headers=cluster.tenant,
        json={"image": "other"},
    )
    assert r.status_code == 400 and r.json()["fields"] == ["image"]
    listed = web.get(f"{cluster.url}/api/v1/task-groups", headers=cluster.tenant).json()
    assert listed["total"] == 1 and listed["groups"][0]["id"] == g["id"]
    r = web.post(f"{cluster.url}/api/v1/task-groups/{g['id']}/stop", headers=cluster.tenant)
    assert r.status_code == 200 and len(r.json()["changed"]) == 3
    assert (
        web.delete(
            f"{cluster.url}/api/v1/task-groups/{g['id']}", headers=cluster.tenant
        ).status_code
        == 200
    )
    assert (
        web.get(f"{cluster.url}/api/v1/task-groups/{g['id']}", headers=cluster.tenant).status_code
        == 404
    )


@pytest.mark.cluster_env(
    HETEROFLOW_GROUP_REPLICA_MAX_RESTARTS="2", HETEROFLOW_GROUP_REPLICA_BACKOFF_S="1"
)
def test_crash_looping_replica_is_bounded_then_the_group_fails(cluster: Cluster) -> None:
    cluster.start_agent("a", "process")
    g = create_group(
        cluster, task_count=2, parallelism="split", command='[ "$RANK" = 0 ] && exit 1; sleep 300'
    )
    cluster.wait(lambda: cluster.group(g["id"])["status"] == "failed", "group failed", 60)
    after = cluster.group(g["id"])
    assert after["reason_code"] == "crash_loop" and "rank 0 failed 3 times" in after["reason"]
    assert after["replacements"] == 2, "two restarts, then the cap"
    rank0 = [t for t in after["tasks"] if t["rank"] == 0]
    assert len(after["superseded_tasks"]) == 2 and rank0[0]["status"] == "failed"
