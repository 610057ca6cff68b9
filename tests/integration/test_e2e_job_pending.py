"""A job that waits on its queue says `pending`, with the queue's reason, and `running` only
once its task holds resources (issue 29, item 1): two one-task jobs on a queue that runs one
job at a time are never both `running`."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.wait import wait_until

from . import web
from .cluster import BIN, Cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def get_job(cluster: Cluster, job_id: str) -> dict[str, Any]:
    r = web.get(f"{cluster.url}/api/v1/jobs/{job_id}", headers=cluster.tenant)
    assert r.status_code == 200, r.text
    return dict(r.json())


def submit_job(cluster: Cluster, name: str, seconds: int) -> str:
    body = {
        "name": name,
        "tasks": [
            {
                "key": "only",
                "name": name,
                "image": "busybox:latest",
                "command": f"sleep {seconds}",
                "gpu_required": 1,
            }
        ],
    }
    r = web.post(f"{cluster.url}/api/v1/jobs", json=body, headers=cluster.tenant)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_a_job_waiting_on_its_queue_is_pending_until_its_task_holds_resources(
    cluster: Cluster,
) -> None:
    cluster.start_agent(
        "n1",
        "process",
        HETEROFLOW_DECLARED_GPUS=f"nvidia:A100-80GB:{80 * 1024}x4",
        HETEROFLOW_NODE_CPU_CORES="16",
    )
    for path, item in (
        ("pools", {"name": "all", "node_selector": {}}),
        (
            "queues",
            {
                "name": "serial",
                "tenant": "default",
                "pools": ["all"],
                "quota": {"max_running_jobs": 1},
                "default": True,
            },
        ),
    ):
        r = web.post(f"{cluster.url}/api/v1/{path}", json=item, headers=cluster.operator)
        assert r.status_code == 201, r.text
    jobs = [submit_job(cluster, "first", 4), submit_job(cluster, "second", 3)]

    # Every status each job showed, in order, polled throughout. A round reads a, b, a: when
    # both reads of a say running (a never goes back to pending here), b's read in between
    # saw both jobs running at once.
    seen: dict[str, list[tuple[str, str]]] = {j: [] for j in jobs}
    both_running: list[str] = []

    def shown(job_id: str) -> str:
        body = get_job(cluster, job_id)
        seen[job_id].append((body["status"], body.get("reason_code", "")))
        return str(body["status"])

    def both_done() -> bool:
        a, b = jobs if len(seen[jobs[0]]) % 2 else jobs[::-1]
        first, other, again = shown(a), shown(b), shown(a)
        if first == other == again == "running":
            both_running.append(f"{a} and {b}")
        return {first, other, again} == {"succeeded"}

    wait_until(both_done, 90, 0.05, lambda: json.dumps(seen)[-3000:])
    assert not both_running, f"both jobs running at once: {both_running[:3]}"

    def history(job_id: str) -> list[str]:
        out: list[str] = []
        for status, _ in seen[job_id]:
            if not out or out[-1] != status:
                out.append(status)
        return out

    # The one admitted second waited, pending with its queue's reason, then ran.
    waited = [j for j in jobs if ("pending", "queue_quota_exceeded") in seen[j]]
    assert len(waited) == 1, seen
    assert history(waited[0]) == ["pending", "running", "succeeded"], seen[waited[0]]
    (other,) = set(jobs) - set(waited)
    assert history(other)[-2:] == ["running", "succeeded"], seen[other]
    done = get_job(cluster, waited[0])
    assert done["tasks"][0]["task"]["status"] == "completed"

    # The jobs' rows are what their events fold to (job_node_progress included).
    replay = subprocess.run(
        [str(BIN), "events", "replay", "--dry-run"],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert json.loads(replay.stdout)["differences"] == {}
