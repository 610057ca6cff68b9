"""Smart retry end to end: failures handled by their cause, on real containers and processes."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
import pytest

from . import web
from .cluster import Cluster
from .conftest import requires_docker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Holds a 20 MB string in the shell: OOM-killed under 32 MB, fine under 64 MB.
ALLOCATE_20MB = "x=$(head -c 20000000 /dev/zero | tr '\\0' a); echo allocated ${#x}"


def retries(cluster: Cluster, task_id: str) -> dict[str, Any]:
    r = web.get(f"{cluster.url}/api/v1/tasks/{task_id}/retries", headers=cluster.tenant)
    assert r.status_code == 200, r.text
    return dict(r.json())


def decisions(cluster: Cluster, task_id: str) -> list[dict[str, Any]]:
    with psycopg.connect(cluster.database_url) as conn:
        rows = conn.execute(
            "SELECT payload FROM events WHERE stream_id = %s AND type = 'task_retry_decided'"
            " ORDER BY version",
            (task_id,),
        ).fetchall()
    return [r[0] for r in rows]


def settle(cluster: Cluster, task_id: str, timeout: float = 60) -> dict[str, Any]:
    """Wait until the task is terminal and the retry engine has decided on it."""

    def done() -> bool:
        task = cluster.task(task_id)
        if task["status"] == "completed":
            return True
        # Read after the task: a decision to give up on this very attempt means nothing moves
        # it any more (a retry decision commits with the move to pending, in one transaction).
        return task["status"] == "failed" and any(
            d["attempt"] == task["retry_count"] and d["action"] == "give_up"
            for d in decisions(cluster, task_id)
        )

    cluster.wait(done, f"{task_id} settled", timeout)
    return cluster.task(task_id)


@requires_docker
@pytest.mark.docker
def test_real_oom_is_retried_with_doubled_memory(cluster: Cluster) -> None:
    cluster.start_agent("d1", "docker")
    t = cluster.create(command=ALLOCATE_20MB, memory_mb=32, retry_delay=0)
    done = settle(cluster, t["id"])
    assert done["status"] == "completed", done
    assert done["memory_mb"] == 64 and done["retry_count"] == 1
    history = retries(cluster, t["id"])["retries"]
    assert [(a["memory_mb"], a["status"]) for a in history] == [(32, "failed"), (64, "completed")]
    assert "OOM" in history[0]["error"]
    (decided,) = decisions(cluster, t["id"])
    assert decided["failure_class"] == "cpu_oom" and "doubled to 64 MB" in decided["reason"]


def test_real_oom_on_the_process_runtime_is_retried_with_doubled_memory(cluster: Cluster) -> None:
    # The same doubling on the process runtime: memory_mb is the task's cgroup limit there,
    # and the cgroup's OOM kill is what classifies the failure.
    cluster.start_agent("p1", "process")
    cluster.wait(lambda: any(n["id"] == "p1" for n in cluster.nodes()), "p1 registered")
    (node,) = [n for n in cluster.nodes() if n["id"] == "p1"]
    if node["inventory"]["cgroups"] == "none":
        pytest.skip("this host has no cgroup the agent can write: process tasks run uncapped")
    assert node["inventory"]["cgroups"] in ("v1", "v2")
    t = cluster.create(command=ALLOCATE_20MB, memory_mb=32, retry_delay=0)
    done = settle(cluster, t["id"])
    assert done["status"] == "completed", done
    assert done["memory_mb"] == 64 and done["retry_count"] == 1
    history = retries(cluster, t["id"])["retries"]
    assert [(a["memory_mb"], a["status"]) for a in history] == [(32, "failed"), (64, "completed")]
    (decided,) = decisions(cluster, t["id"])
    assert decided["failure_class"] == "cpu_oom" and "doubled to 64 MB" in decided["reason"]


@requires_docker
@pytest.mark.docker
def test_missing_image_fails_once_permanently(cluster: Cluster) -> None:
    cluster.start_agent("d1", "docker")
    t = cluster.create(image="heteroflow/does-not-exist:1.0", command="true", retry_delay=0)
    done = settle(cluster, t["id"])
    assert done["status"] == "failed" and done["retry_count"] == 0
    assert "ImageNotFound" in done["error"]
    (decided,) = decisions(cluster, t["id"])
    assert decided["action"] == "give_up" and decided["failure_class"] == "permanent"
    assert len(retries(cluster, t["id"])["retries"]) == 1


def test_transient_error_retries_on_the_same_node(cluster: Cluster) -> None:
    cluster.start_agent("a", "process")
    cluster.start_agent("b", "process")
    t = cluster.create(
        command="echo 'dial tcp 10.0.0.9:443: i/o timeout' >&2; exit 1",
        max_retries=2,
        retry_delay=0,
    )
    done = settle(cluster, t["id"])
    assert done["status"] == "failed" and done["retry_count"] == 2
    nodes = {a["node_id"] for a in retries(cluster, t["id"])["retries"]}
    assert len(nodes) == 1
    assert all(d["failure_class"] == "transient" for d in decisions(cluster, t["id"])[:2])


def test_unknown_exit_moves_to_another_node(cluster: Cluster) -> None:
    cluster.start_agent("a", "process")
    cluster.start_agent("b", "process")
    t = cluster.create(command="exit 3", max_retries=1, retry_delay=0)
    settle(cluster, t["id"])
    history = retries(cluster, t["id"])["retries"]
    assert len(history) == 2 and history[0]["node_id"] != history[1]["node_id"]
    assert "retry_new_node on another node" in decisions(cluster, t["id"])[0]["reason"]


def test_no_retry_never_retries(cluster: Cluster) -> None:
    cluster.start_agent("a", "process")
    t = cluster.create(command="exit 3", retry_strategy="no_retry", retry_delay=0)
    done = settle(cluster, t["id"])
    assert done["status"] == "failed" and done["retry_count"] == 0
    assert decisions(cluster, t["id"])[0]["reason"] == "retry_strategy is no_retry"


GPU_OOM_ON_SMALL = (
    'case "$CUDA_VISIBLE_DEVICES" in *small*) sleep 2; '
    'echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"; exit 1;; '
    "*) echo trained on $CUDA_VISIBLE_DEVICES;; esac"
)


def test_gpu_oom_moves_to_a_node_with_more_vram(cluster: Cluster) -> None:
    cluster.start_agent("small", "process", HETEROFLOW_DECLARED_GPUS="nvidia:T4:8192")
    # The first attempt fails only once the bigger node is online: the retry engine must see
    # it when it decides (a fixed delay raced the second agent's start on a loaded machine).
    flag = cluster.root / "big-online"
    wait_for_big = f'while [ ! -e "{flag}" ]; do sleep 0.1; done; '
    t = cluster.create(command=wait_for_big + GPU_OOM_ON_SMALL, gpu_required=1, retry_delay=0)
    cluster.wait_status(t["id"], "running")
    cluster.start_agent("big", "process", HETEROFLOW_DECLARED_GPUS="nvidia:A10:24576")
    flag.touch()
    done = settle(cluster, t["id"])
    assert done["status"] == "completed" and done["node_id"] == "big"
    (decided,) = decisions(cluster, t["id"])
    assert decided["failure_class"] == "gpu_oom" and "8192 MB" in decided["reason"]


def test_gpu_oom_without_a_bigger_node_is_permanent(cluster: Cluster) -> None:
    cluster.start_agent("small", "process", HETEROFLOW_DECLARED_GPUS="nvidia:T4:8192")
    t = cluster.create(command=GPU_OOM_ON_SMALL, gpu_required=1, retry_delay=0)
    done = settle(cluster, t["id"])
    assert done["status"] == "failed" and done["retry_count"] == 0
    (decided,) = decisions(cluster, t["id"])
    assert decided["action"] == "give_up" and "no online node" in decided["reason"]


def test_retries_stop_at_max_and_back_off(cluster: Cluster) -> None:
    cluster.start_agent("a", "process")
    t = cluster.create(
        command="exit 5",
        max_retries=2,
        retry_delay=1,
        backoff_multiplier=3,
        retry_strategy="retry_same_node",
    )
    done = settle(cluster, t["id"], timeout=60)
    assert done["status"] == "failed" and done["retry_count"] == 2
    history = retries(cluster, t["id"])["retries"]
    assert len(history) == 3
    gaps = [
        (
            datetime.fromisoformat(b["started_at"]) - datetime.fromisoformat(a["finished_at"])
        ).total_seconds()
        for a, b in zip(history, history[1:], strict=False)
    ]
    # 1 s then 3 s, plus at most a scheduling round and a start.
    assert 1.0 <= gaps[0] < 1.0 + 2.5, gaps
    assert 3.0 <= gaps[1] < 3.0 + 2.5, gaps
    actions = [d["action"] for d in decisions(cluster, t["id"])]
    assert actions == ["retry", "retry", "give_up"]
    assert "retries exhausted (2/2)" in decisions(cluster, t["id"])[-1]["reason"]
