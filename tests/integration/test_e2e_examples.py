"""examples/ applied by the real CLI against `heteroflow up` with a process-runtime agent,
as a user does after `heteroflow up`: `heteroflow apply -f examples/` (credentials from
$HETEROFLOW_HOME/credentials.json, the operator token for the queue and pool), then each
example runs: the task and the job DAG complete, the inference group answers through
/serve/, the training world runs; a second apply is unchanged, and `delete -f` removes it all.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.wait import wait_until

from . import web
from .cluster import BIN, Cluster

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
JOB_TERMINAL = {"succeeded", "failed", "cancelled", "stopped"}


def heteroflow(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a child process, with the environment `heteroflow up` left behind."""
    return subprocess.run(
        [str(BIN), *args, "--server", cluster.url],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def get(cluster: Cluster, path: str) -> httpx.Response:
    operator = path.startswith(("queues/", "pools/"))
    headers = cluster.operator if operator else cluster.tenant
    return web.get(f"{cluster.url}/api/v1/{path}", headers=headers)


def view(cluster: Cluster, path: str) -> dict[str, Any]:
    r = get(cluster, path)
    assert r.status_code == 200, r.text
    return dict(r.json())


# The group's schedule window (weekdays 07:00-20:00 UTC) would pause it at some hours of
# the week; the controller's pass is kept out of the test so what it shows does not depend
# on when it runs (the window itself: test_window_controller, test_gateway_scale).
@pytest.mark.cluster_env(HETEROFLOW_WINDOW_INTERVAL_S="3600")
def test_examples_run_under_heteroflow_up(cluster: Cluster) -> None:
    cluster.start_agent("ex1", "process")
    applied = heteroflow(cluster, "apply", "-f", str(EXAMPLES))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    ids = dict(re.findall(r"^(\w+/[\w-]+) created \(([\w-]+)\)$", applied.stdout, re.M))
    assert set(ids) == {
        "Task/hello",
        "TaskGroup/chat",
        "TaskGroup/train-resnet",
        "Job/nightly-etl",
    }, applied.stdout
    assert "Pool/cpu-nodes created" in applied.stdout, applied.stdout
    assert "Queue/research created" in applied.stdout, applied.stdout

    task = cluster.wait_status(ids["Task/hello"], "completed", "failed", timeout=60)
    assert task["status"] == "completed", task
    assert "hello from HeteroFlow" in cluster.logs(task["id"])

    def job_done() -> dict[str, Any] | None:
        now = view(cluster, f"jobs/{ids['Job/nightly-etl']}")
        return now if now["status"] in JOB_TERMINAL else None

    job = wait_until(job_done, 60, 0.2, lambda: cluster.log("control"))
    assert job["status"] == "succeeded", job
    steps = {t["key"]: (t["task"] or {}).get("status") for t in job["tasks"]}
    assert steps == {"prep": "completed", "train": "completed", "report": "completed"}, job

    chat = ids["TaskGroup/chat"]

    def serves() -> bool:
        try:
            r = httpx.get(f"{cluster.url}/serve/{chat}/", headers=cluster.tenant, timeout=10)
        except httpx.HTTPError:
            return False
        return r.status_code == 200 and "Directory listing" in r.text

    cluster.wait(serves, "the inference group answers through /serve/", timeout=60)

    train = ids["TaskGroup/train-resnet"]
    cluster.wait(
        lambda: (
            [t["status"] for t in cluster.group(train)["tasks"]] in (["running"], ["completed"])
        ),
        "the training world's rank runs",
        timeout=60,
    )

    again = heteroflow(cluster, "apply", "-f", str(EXAMPLES))
    assert again.returncode == 0, again.stdout + again.stderr
    lines = again.stdout.splitlines()
    assert len(lines) == 6 and all(" unchanged" in line for line in lines), again.stdout

    deleted = heteroflow(cluster, "delete", "-f", str(EXAMPLES))
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    assert deleted.stdout.count(" deleted") == 6, deleted.stdout
    for path in (
        f"tasks/{ids['Task/hello']}",
        f"task-groups/{chat}",
        f"task-groups/{train}",
        f"jobs/{ids['Job/nightly-etl']}",
        "queues/research",
        "pools/cpu-nodes",
    ):
        assert get(cluster, path).status_code == 404, path
