"""Inference serving end to end: the router in front of real busybox containers (docs/serving.md).

Replicas are `busybox httpd` (a static health file and a static page) or, where a test needs
an engine that records calls or breaks a connection, a `nc -ll -e` shell server.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import psycopg
import pytest

from . import web
from .cluster import Cluster
from .conftest import requires_docker

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.docker, requires_docker]

HTTPD = (
    "mkdir -p /tmp/www && echo ok > /tmp/www/healthz && "
    'echo "hello from $HETEROFLOW_TASK_ID" > /tmp/www/index.html && '
    "exec httpd -f -p 8000 -h /tmp/www"
)
# A fake engine: answers every path with 200 "ok <path>", records /sleep and /wake_up calls
# in /tmp/calls (writable whatever uid the node forces on containers), drops the
# connection without an answer on /boom, and streams three Server-Sent Events one second
# apart on /events.
ENGINE = r"""cat > /tmp/h <<'EOF'
#!/bin/sh
read -r method path rest
# The headers, then the body, read before answering: closed with input unread, the
# connection is reset and the router may see that before the answer.
len=0
while read -r line; do
  line=$(printf '%s' "$line" | tr -d '\r')
  case "$line" in
    [Cc]ontent-[Ll]ength:*) len=${line#*: } ;;
    "") break ;;
  esac
done
[ "$len" -gt 0 ] && head -c "$len" > /dev/null
case "$path" in
  /boom*) exit 0 ;;
  /events*)
    printf 'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n'
    for i in 1 2 3; do printf 'data: %s\n\n' "$i"; sleep 1; done
    exit 0 ;;
  /sleep*|/wake_up*) echo "$method $path" >> /tmp/calls ;;
esac
body="ok $path"
head='HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n'
printf "$head"'Content-Length: %s\r\n\r\n%s' "${#body}" "$body"
EOF
chmod +x /tmp/h; touch /tmp/calls; exec nc -ll -p 8000 -e /tmp/h"""
SERVING = {"port": 8000, "health_path": "/healthz"}


def create_group(cluster: Cluster, **body: Any) -> dict[str, Any]:
    body = {
        "name": "llm",
        "image": "busybox:latest",
        "task_type": "inference",
        "command": HTTPD,
        "serving": SERVING,
    } | body
    return cluster.create_group(**body)


def serving(cluster: Cluster, group_id: str) -> dict[str, Any]:
    r = web.get(f"{cluster.url}/api/v1/task-groups/{group_id}/serving", headers=cluster.tenant)
    assert r.status_code == 200, r.text
    return dict(r.json())


def ready_replicas(cluster: Cluster, group_id: str) -> set[str]:
    return {r["task_id"] for r in serving(cluster, group_id)["replicas"] if r["ready"]}


def call(cluster: Cluster, target: str, path: str = "", **kw: Any) -> httpx.Response:
    kw.setdefault("headers", cluster.tenant)
    kw.setdefault("timeout", httpx.Timeout(40.0, connect=2.0))
    return httpx.request(kw.pop("method", "GET"), f"{cluster.url}/serve/{target}/{path}", **kw)


def bus_metrics(cluster: Cluster, target: str, within_s: float = 15.0) -> dict[str, Any]:
    """The first ServingMetrics message the router publishes for `target`."""
    import nats

    async def first() -> dict[str, Any]:
        nc = await nats.connect(cluster.nats.url)
        try:
            sub = await nc.subscribe(f"hf.serving.{target}.metrics")
            msg = await sub.next_msg(timeout=within_s)
            return dict(json.loads(msg.data))
        finally:
            await nc.close()

    return asyncio.run(first())


def timeline_kinds(cluster: Cluster, task_id: str) -> list[str]:
    with psycopg.connect(cluster.database_url) as conn:
        rows = conn.execute(
            "SELECT kind FROM timeline WHERE subject_id = %s ORDER BY occurred_at", (task_id,)
        ).fetchall()
    return [r[0] for r in rows]


@pytest.mark.cluster_env(HETEROFLOW_SERVE_METRICS_INTERVAL_S="1")
def test_requests_reach_both_replicas_and_survive_a_killed_one(cluster: Cluster) -> None:
    import docker

    cluster.start_agent("sv1", "docker")
    g = create_group(cluster, task_count=2)
    cluster.wait(lambda: len(ready_replicas(cluster, g["id"])) == 2, "two ready replicas", 60)
    seen: dict[str, int] = {}
    for _ in range(20):
        r = call(cluster, g["id"], "index.html")
        assert r.status_code == 200, r.text
        replica = r.headers["x-heteroflow-replica"]
        assert r.text.strip() == f"hello from {replica}"
        seen[replica] = seen.get(replica, 0) + 1
    assert len(seen) == 2, f"both replicas served: {seen}"

    figures = serving(cluster, g["id"])
    assert figures["requests_per_second"] > 0 and figures["latency_p95_ms"] > 0
    assert figures["concurrent_requests"] == 0 and figures["queued_requests"] == 0
    assert [r["ready"] for r in figures["replicas"]] == [True, True]
    published = bus_metrics(cluster, g["id"])
    assert published["requests_per_second"] > 0 and published["ready_replicas"] == 2
    exported = web.get(f"{cluster.url}/metrics").text
    assert f'heteroflow_serve_requests_total{{status="200",target="{g["id"]}"}} 20.0' in exported

    victim = next(t for t in cluster.group(g["id"])["tasks"] if t["rank"] == 0)
    docker.from_env().containers.get(victim["container_id"]).kill()
    failures, served = 0, 0
    deadline = time.monotonic() + 60

    def healed() -> bool:
        members = cluster.group(g["id"])["tasks"]
        return (
            victim["id"] not in {t["id"] for t in members}
            and len(ready_replicas(cluster, g["id"])) == 2
        )

    while not healed():
        assert time.monotonic() < deadline, "rank 0 was not rebuilt and ready within 60 s"
        r = call(cluster, g["id"], "index.html")
        served += r.status_code == 200
        failures += r.status_code != 200
    assert served > 0 and failures <= 1, f"{failures} failed requests while rebuilding"
    replicas = {
        call(cluster, g["id"], "index.html").headers["x-heteroflow-replica"] for _ in range(10)
    }
    assert len(replicas) == 2 and victim["id"] not in replicas


@pytest.mark.cluster_env(HETEROFLOW_SERVE_MAX_BODY_BYTES="1024")
def test_router_refusals_name_what_is_wrong(cluster: Cluster) -> None:
    cluster.start_agent("sv1", "docker")
    engine = cluster.create(name="engine", task_type="inference", command=ENGINE, serving=SERVING)
    plain = cluster.create(name="plain", command="sleep 300")
    cluster.wait_status(engine["id"], "running", timeout=60)
    cluster.wait(lambda: call(cluster, engine["id"], "healthz").status_code == 200, "engine ready")

    r = web.post(
        f"{cluster.url}/api/v1/tenants",
        json={"id": "other", "gpu_quota": 1},
        headers=cluster.operator,
    )
    assert r.status_code == 201, r.text
    r = web.post(
        f"{cluster.url}/api/v1/tenants/other/api-keys",
        json={"name": "k"},
        headers=cluster.operator,
    )
    other = {"Authorization": f"Bearer {r.json()['key']}"}
    r = call(cluster, engine["id"], "healthz", headers=other)
    assert r.status_code == 404 and r.json()["code"] == 40401, r.text
    r = call(cluster, "grp-nosuchgroup", "x")
    assert r.status_code == 404, r.text

    r = call(cluster, plain["id"], "x")
    assert r.status_code == 409 and "declares no serving port" in r.json()["error"], r.text

    r = call(cluster, engine["id"], "echo", method="POST", content=b"x" * 2048)
    assert r.status_code == 413 and r.json()["code"] == 41301, r.text
    r = call(cluster, engine["id"], "echo", method="POST", content=b"x" * 512)
    assert r.status_code == 200 and r.text == "ok /echo", r.text

    r = call(cluster, engine["id"], "boom", method="POST")
    assert r.status_code == 502, r.text
    assert engine["id"] in r.json()["error"] and r.json()["code"] == 50201, r.text
    # The gateway is unharmed and the replica serves again once its health answers.
    cluster.wait(lambda: call(cluster, engine["id"], "again").status_code == 200, "served")

    # Server-Sent Events pass through unbuffered: each event arrives as it is sent.
    url = f"{cluster.url}/serve/{engine['id']}/events"
    arrivals: list[tuple[float, str]] = []
    with httpx.stream("GET", url, headers=cluster.tenant, timeout=20) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
        started = time.monotonic()
        for line in r.iter_lines():
            if line.startswith("data: "):
                arrivals.append((time.monotonic() - started, line))
    assert [line for _, line in arrivals] == ["data: 1", "data: 2", "data: 3"]
    assert arrivals[0][0] < 0.8 and arrivals[2][0] > 1.5, arrivals
    # A client that leaves mid-stream releases the replica: nothing stays outstanding.
    with httpx.stream("GET", url, headers=cluster.tenant, timeout=20) as r:
        next(r.iter_lines())

    def released() -> bool:
        r = web.get(f"{cluster.url}/api/v1/tasks/{engine['id']}/serving", headers=cluster.tenant)
        view = r.json()
        return bool(view["concurrent_requests"] == 0 and view["replicas"][0]["outstanding"] == 0)

    cluster.wait(released, "the abandoned stream released", 10)
    assert web.get(f"{cluster.url}/readyz").status_code == 200
    cluster.wait(lambda: call(cluster, engine["id"], "again").status_code == 200, "served again")


def group_sleeping(cluster: Cluster, group_id: str) -> bool:
    g = cluster.group(group_id)
    return g["status"] == "sleeping" and all(t["status"] == "sleeping" for t in g["tasks"])


@pytest.mark.cluster_env(HETEROFLOW_SERVE_IDLE_MINUTE_S="3", HETEROFLOW_SERVE_WAIT_S="40")
def test_idle_group_sleeps_and_a_request_wakes_it(cluster: Cluster) -> None:
    import docker

    cluster.start_agent("sv1", "docker")
    g = create_group(cluster, task_count=2, idle_timeout_minutes=1)  # 3 s here
    cluster.wait(lambda: len(ready_replicas(cluster, g["id"])) == 2, "two ready replicas", 60)
    assert call(cluster, g["id"], "index.html").status_code == 200
    cluster.wait(lambda: group_sleeping(cluster, g["id"]), "idle group asleep", 30)
    members = cluster.group(g["id"])["tasks"]
    client = docker.from_env()
    # busybox httpd has no /sleep endpoint: the agent froze the containers instead.
    cluster.wait(
        lambda: all(client.containers.get(t["container_id"]).status == "paused" for t in members),
        "containers paused",
    )

    started = time.monotonic()
    r = call(cluster, g["id"], "index.html")
    assert r.status_code == 200, r.text
    assert time.monotonic() - started < 40
    assert r.text.strip() == f"hello from {r.headers['x-heteroflow-replica']}"
    for t in members:
        kinds = timeline_kinds(cluster, t["id"])
        assert "idle_sleep" in kinds and "request_wake" in kinds, kinds
        assert cluster.statuses(t["id"])[-3:] == ["sleeping", "waking", "running"]


@pytest.mark.cluster_env(HETEROFLOW_SERVE_IDLE_MINUTE_S="2")
def test_engine_with_a_sleep_endpoint_is_slept_through_it_not_paused(cluster: Cluster) -> None:
    import docker

    cluster.start_agent("sv1", "docker")
    engine = cluster.create(
        name="engine",
        task_type="inference",
        command=ENGINE,
        serving=SERVING,
        idle_timeout_minutes=1,
    )
    cluster.wait_status(engine["id"], "running", timeout=60)
    cluster.wait(lambda: call(cluster, engine["id"], "healthz").status_code == 200, "ready")
    cluster.wait_status(engine["id"], "sleeping", timeout=30)
    container = docker.from_env().containers.get(cluster.task(engine["id"])["container_id"])

    def calls() -> list[str]:
        out = container.exec_run(["cat", "/tmp/calls"]).output.decode()
        return [line.strip() for line in out.splitlines() if line.strip()]

    cluster.wait(lambda: calls() == ["POST /sleep?level=1"], "the engine's /sleep called")
    container.reload()
    assert container.status == "running", "slept through the engine, not frozen"
    r = call(cluster, engine["id"], "v1/models")
    assert r.status_code == 200 and r.text == "ok /v1/models", r.text
    assert calls() == ["POST /sleep?level=1", "POST /wake_up"]


@pytest.mark.cluster_env(HETEROFLOW_LIVENESS_FLOOR_S="4", HETEROFLOW_LIVENESS_STALE_S="3")
def test_frozen_replica_is_declared_dead_and_rebuilt_an_idle_one_is_not(
    cluster: Cluster,
) -> None:
    import docker

    cluster.start_agent("sv1", "docker")
    g = create_group(cluster, task_count=2)
    cluster.wait(lambda: len(ready_replicas(cluster, g["id"])) == 2, "two ready replicas", 60)
    members = {t["rank"]: t for t in cluster.group(g["id"])["tasks"]}
    frozen, idle = members[0], members[1]
    docker.from_env().containers.get(frozen["container_id"]).pause()  # behind its back

    def rebuilt() -> bool:
        now = {t["rank"]: t for t in cluster.group(g["id"])["tasks"]}
        return bool(now[0]["id"] != frozen["id"] and now[0]["status"] == "running")

    cluster.wait(rebuilt, "rank 0 declared dead and replaced", 60)
    dead = cluster.task(frozen["id"])
    assert dead["status"] == "failed" and dead["status_reason_code"] == "liveness_lost", dead
    assert "container paused" in dead["error"] and "health endpoint failing" in dead["error"]
    assert "liveness_lost" in timeline_kinds(cluster, frozen["id"])
    # Idle the whole time (no request at all since), yet healthy: never touched.
    untouched = cluster.task(idle["id"])
    assert untouched["status"] == "running" and untouched["version"] == idle["version"]
    # What was left of the dead replica is stopped, not left frozen on its cards.
    cluster.wait(
        lambda: docker.from_env().containers.get(frozen["container_id"]).status == "exited",
        "the frozen container stopped",
    )


@pytest.mark.cluster_env(HETEROFLOW_SERVE_IDLE_MINUTE_S="2", HETEROFLOW_SERVE_WAIT_S="50")
def test_request_for_a_sleeper_whose_host_is_gone_is_served_elsewhere(cluster: Cluster) -> None:
    """The node's loss sends the sleeping replica back to pending (no task is stuck on a
    lost host), and a request for it waits until it runs on the new host."""
    import docker

    cluster.start_agent("sv1", "docker")
    t = cluster.create(
        name="llm",
        task_type="inference",
        command=HTTPD,
        serving=SERVING,
        idle_timeout_minutes=1,
    )
    cluster.wait_status(t["id"], "running", timeout=60)
    cluster.wait(lambda: call(cluster, t["id"], "index.html").status_code == 200, "served")
    asleep = cluster.wait_status(t["id"], "sleeping", timeout=30)
    cluster.kill_agent("sv1")
    # The host is gone with what ran on it (both agents share this machine's engine, where
    # the old container would otherwise still hold the attempt's name).
    docker.from_env().containers.get(asleep["container_id"]).remove(force=True)
    cluster.wait(
        lambda: any(n["id"] == "sv1" and n["status"] == "offline" for n in cluster.nodes()),
        "sv1 offline",
    )
    cluster.start_agent("sv2", "docker")

    r = call(cluster, t["id"], "index.html")
    assert r.status_code == 200, r.text
    assert r.text.strip() == f"hello from {t['id']}"
    moved = cluster.task(t["id"])
    assert moved["node_id"] == "sv2" and moved["status"] == "running"
    assert "node_lost_migration" in timeline_kinds(cluster, t["id"])
    assert cluster.statuses(t["id"])[-5:] == [
        "sleeping",
        "pending",
        "scheduled",
        "starting",
        "running",
    ], cluster.history(t["id"])


@pytest.mark.cluster_env(HETEROFLOW_SERVE_IDLE_MINUTE_S="2", HETEROFLOW_SERVE_ADOPT_INTERVAL_S="1")
def test_a_target_nobody_ever_called_still_goes_to_sleep(cluster: Cluster) -> None:
    cluster.start_agent("sv1", "docker")
    t = cluster.create(
        name="llm", task_type="inference", command=HTTPD, serving=SERVING, idle_timeout_minutes=1
    )
    cluster.wait_status(t["id"], "running", timeout=60)
    asleep = cluster.wait_status(t["id"], "sleeping", timeout=30)
    assert asleep["status_reason_code"] == "idle_sleep"
    cluster.wait(lambda: "idle_sleep" in timeline_kinds(cluster, t["id"]), "timeline entry")
