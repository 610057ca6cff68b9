"""Tasks really run: HTTP → scheduler → agent → container/process → reports, end to end."""

from __future__ import annotations

import time

import httpx
import psutil
import pytest

from . import web
from .cluster import Cluster
from .conftest import requires_docker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RUNTIMES = [pytest.param("docker", marks=[requires_docker, pytest.mark.docker]), "process"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_task_runs_to_completion_with_logs(cluster: Cluster, runtime: str) -> None:
    cluster.start_agent("n1", runtime)
    t = cluster.create(command="echo hello-from-task; echo second line")
    done = cluster.wait_status(t["id"], "completed", "failed")
    assert done["status"] == "completed", done
    assert done["exit_code"] == 0 and done["node_id"] == "n1"
    assert cluster.statuses(t["id"]) == ["pending", "scheduled", "starting", "running", "completed"]
    r = web.get(f"{cluster.url}/api/v1/tasks/{t['id']}/logs?lines=10", headers=cluster.tenant)
    assert r.status_code == 200, r.text
    assert r.json()["logs"][-2:] == ["hello-from-task", "second line"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_failure_is_reported_with_exit_code(cluster: Cluster, runtime: str) -> None:
    cluster.start_agent("n1", runtime)
    t = cluster.create(command="echo broken >&2; exit 3", max_retries=0)
    done = cluster.wait_status(t["id"], "completed", "failed")
    assert done["status"] == "failed" and done["exit_code"] == 3
    assert "exit code 3" in done["error"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_stop_ends_stopped_and_late_success_gets_409(cluster: Cluster, runtime: str) -> None:
    cluster.start_agent("n1", runtime)
    t = cluster.create(command="sleep 60")
    cluster.wait_status(t["id"], "running")
    r = web.post(f"{cluster.url}/api/v1/tasks/{t['id']}/stop", headers=cluster.tenant)
    assert r.status_code == 200 and r.json()["status"] == "stopping"
    done = cluster.wait_status(t["id"], "stopped", "completed", "failed")
    assert done["status"] == "stopped"
    late = web.put(
        f"{cluster.url}/api/v1/tasks/{t['id']}",
        headers=cluster.agent_key("n1"),
        json={"status": "completed", "expected_status": "running", "exit_code": 0},
    )
    assert late.status_code == 409 and late.json()["code"] == 40901
    assert cluster.task(t["id"])["status"] == "stopped"
    assert "completed" not in cluster.statuses(t["id"])


def _paused(runtime: str, container_or_pid: str) -> bool:
    if runtime == "docker":
        import docker

        return bool(docker.from_env().containers.get(container_or_pid).attrs["State"]["Paused"])
    proc = psutil.Process(int(container_or_pid))
    return all(p.status() == psutil.STATUS_STOPPED for p in [proc, *proc.children(recursive=True)])


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_sleep_pauses_and_wake_resumes(cluster: Cluster, runtime: str) -> None:
    cluster.start_agent("n1", runtime)
    t = cluster.create(command="while true; do sleep 0.2; done")
    running = cluster.wait_status(t["id"], "running")
    handle = running["container_id"]
    r = web.post(f"{cluster.url}/api/v1/tasks/{t['id']}/sleep", headers=cluster.tenant)
    assert r.status_code == 200 and r.json()["status"] == "sleeping"
    cluster.wait(lambda: _paused(runtime, handle), "container paused")
    r = web.post(f"{cluster.url}/api/v1/tasks/{t['id']}/wake", headers=cluster.tenant, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "running"
    assert not _paused(runtime, handle)
    r = web.post(f"{cluster.url}/api/v1/tasks/{t['id']}/sleep", headers=cluster.tenant)
    assert r.status_code == 200
    r = web.post(f"{cluster.url}/api/v1/tasks/{t['id']}/sleep", headers=cluster.tenant)
    assert r.status_code == 400 and r.json()["code"] == 40030 and "sleeping" in r.json()["error"]


def test_unknown_gpu_type_stays_pending_with_reason(cluster: Cluster) -> None:
    cluster.start_agent("n1", "process", HETEROFLOW_DECLARED_GPUS="amd:MI300X:196608x2")
    t = cluster.create(command="true", gpu_required=1, gpu_type="H100")
    cluster.wait(lambda: cluster.task(t["id"])["pending_reason"] != "", "a pending reason")
    task = cluster.task(t["id"])
    assert task["status"] == "pending"
    assert "H100" in task["pending_reason"] and "gpu_type" in task["pending_reason"]
    fits = cluster.create(command="true", gpu_required=1, gpu_type="amd")
    assert cluster.wait_status(fits["id"], "completed")["gpu_ids"]


def test_node_loss_requeues_on_the_other_agent(cluster: Cluster) -> None:
    cluster.start_agent("a", "process")
    cluster.start_agent("b", "process")
    t = cluster.create(command="sleep 120", max_retries=0)
    first = cluster.wait_status(t["id"], "running")
    lost, other = first["node_id"], ({"a", "b"} - {first["node_id"]}).pop()
    killed_at = time.monotonic()
    cluster.kill_agent(lost)
    cluster.wait(
        lambda: (
            cluster.task(t["id"])["node_id"] == other
            and cluster.task(t["id"])["status"] == "running"
        ),
        "task running on the other",
    )
    elapsed = time.monotonic() - killed_at
    # threshold (3 s in this cluster) + detection tick + one scheduling round + start
    assert elapsed < 3 + 10, elapsed
    history = cluster.statuses(t["id"])
    assert history[history.index("running") + 1] == "pending", history
    offline = [n for n in cluster.nodes() if n["id"] == lost][0]
    assert offline["status"] == "offline"


def test_logs_of_a_gone_node_are_a_clear_error(cluster: Cluster) -> None:
    cluster.start_agent("n1", "process")
    t = cluster.create(command="echo bye")
    cluster.wait_status(t["id"], "completed")
    cluster.kill_agent("n1")
    r = web.get(f"{cluster.url}/api/v1/tasks/{t['id']}/logs", headers=cluster.tenant, timeout=15)
    assert r.status_code == 500 and r.json()["code"] == 50002
    assert "n1" in r.json()["error"]


def test_logs_follow_streams_server_sent_events(cluster: Cluster) -> None:
    cluster.start_agent("n1", "process")
    t = cluster.create(command="for i in 1 2 3; do echo line-$i; sleep 0.5; done")
    cluster.wait_status(t["id"], "running", "completed")
    lines: list[str] = []
    with httpx.stream(
        "GET",
        f"{cluster.url}/api/v1/tasks/{t['id']}/logs?follow=true",
        headers=cluster.tenant,
        timeout=30,
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for raw in r.iter_lines():
            if raw.startswith("data: line-"):
                lines.append(raw.removeprefix("data: "))
            if raw.startswith("event: end"):
                break
    assert lines == ["line-1", "line-2", "line-3"]


def test_timeout_fails_the_task(cluster: Cluster) -> None:
    cluster.start_agent("n1", "process")
    t = cluster.create(command="sleep 60", timeout=1, max_retries=0)
    done = cluster.wait_status(t["id"], "failed", "completed", timeout=40)
    assert done["status"] == "failed" and "timeout" in done["error"].lower()


def test_delete_of_running_task_stops_it(cluster: Cluster) -> None:
    cluster.start_agent("n1", "process")
    t = cluster.create(command="sleep 60")
    cluster.wait_status(t["id"], "running")
    r = web.delete(f"{cluster.url}/api/v1/tasks/{t['id']}", headers=cluster.tenant)
    assert r.status_code == 200
    assert (
        web.get(f"{cluster.url}/api/v1/tasks/{t['id']}", headers=cluster.tenant).status_code == 404
    )
    cluster.wait(lambda: cluster.statuses(t["id"])[-1] == "stopped", "stopped after delete")
