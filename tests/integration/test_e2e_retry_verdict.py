"""The retry engine's verdict is on the task (issue 29, item 6): a permanent failure reads
`failed` with `retry.verdict` `give_up` and why, a retried task reads the `retry` verdict,
from `GET /tasks/{id}` and `heteroflow describe`; the verdict is folded from the
`task_retry_decided` event, so a replay of the log gives the same rows."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from .cluster import BIN, Cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def heteroflow(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = cluster.env | {
        "HETEROFLOW_SERVER": cluster.url,
        "HETEROFLOW_TOKEN": cluster.creds["tenant_api_key"],
    }
    return subprocess.run(
        [str(BIN), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def verdict(cluster: Cluster, task_id: str, *verdicts: str) -> dict[str, Any]:
    """The task once the retry engine's last verdict is one of `verdicts`."""
    cluster.wait(
        lambda: (cluster.task(task_id).get("retry") or {}).get("verdict") in verdicts,
        f"{task_id} with a {verdicts} verdict (now {cluster.task(task_id).get('retry')})",
        60,
    )
    return cluster.task(task_id)


def test_a_permanent_failure_and_a_retry_show_their_verdict_on_the_task(
    cluster: Cluster,
) -> None:
    cluster.start_agent("a", "process")
    marker = cluster.root / "second-attempt"
    permanent = cluster.create(
        name="denied", command="echo 'open /data: permission denied' >&2; exit 1", retry_delay=0
    )
    retried = cluster.create(
        name="flaky",
        command=f"test -e {marker} && exit 0; touch {marker}; exit 3",
        max_retries=2,
        retry_delay=0,
    )

    gave_up = verdict(cluster, permanent["id"], "give_up")
    assert (gave_up["status"], gave_up["retry_count"]) == ("failed", 0)
    retry = gave_up["retry"]
    assert (retry["verdict"], retry["failure_class"], retry["attempt"]) == (
        "give_up",
        "permanent",
        0,
    )
    assert "permission denied" in retry["reason"], retry
    assert retry["decided_at"] >= gave_up["finished_at"]

    cluster.wait_status(retried["id"], "completed", timeout=60)
    again = verdict(cluster, retried["id"], "retry")
    assert again["retry"]["verdict"] == "retry" and again["retry_count"] == 1
    assert again["retry"]["failure_class"] == "other" and again["retry"]["attempt"] == 0
    assert "exit code 3" in again["retry"]["reason"], again["retry"]

    described = heteroflow(cluster, "describe", permanent["id"])
    assert described.returncode == 0, described.stderr
    line = next(x for x in described.stdout.splitlines() if x.startswith("Retry verdict:"))
    assert "given up (failed for good), permanent" in line and "permission denied" in line

    replay = heteroflow(cluster, "events", "replay", "--dry-run")
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert json.loads(replay.stdout)["differences"] == {}
