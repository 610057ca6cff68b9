"""The `heteroflow` user commands, run as the installed console script against a real
control plane and a process-runtime agent."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .cluster import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BIN = Path(sys.executable).parent / "heteroflow"


def hf(
    cluster: Cluster, *args: str, token: str = "tenant_api_key", timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    env = cluster.env | {
        "HETEROFLOW_SERVER": cluster.url,
        "HETEROFLOW_TOKEN": cluster.creds[token],
        # No credentials file to fall back on: the environment alone must be enough.
        "HETEROFLOW_HOME": tempfile.mkdtemp(prefix="hf-cli-home-"),
    }
    return subprocess.run(
        [str(BIN), *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_run_detached_then_follow_logs_and_describe(cluster: Cluster) -> None:
    cluster.start_agent("n1", "process")
    started = hf(
        cluster,
        "run",
        "-d",
        "--name",
        "hello",
        "busybox:latest",
        "--",
        "echo one; sleep 1; echo two",
    )
    assert started.returncode == 0, started.stderr
    task_id = started.stdout.strip()
    assert task_id.startswith("task-")

    logs = hf(cluster, "logs", "-f", task_id)
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.splitlines() == ["one", "two"]
    assert cluster.wait_status(task_id, "completed")["exit_code"] == 0

    tail = hf(cluster, "logs", "-n", "1", task_id)
    assert (tail.returncode, tail.stdout) == (0, "two\n")

    text = hf(cluster, "describe", task_id)
    assert text.returncode == 0, text.stderr
    assert "Name:" in text.stdout and "hello" in text.stdout
    assert "completed" in text.stdout and "Attempts:" in text.stdout

    data = json.loads(hf(cluster, "describe", task_id, "-o", "json").stdout)
    assert data["task"]["id"] == task_id
    assert [a["status"] for a in data["retries"]] == ["completed"]

    # `ps` hides finished work unless -a; `-o` also works before the command.
    assert task_id not in [t["id"] for t in json.loads(hf(cluster, "ps", "-o", "json").stdout)]
    listed = json.loads(hf(cluster, "-o", "json", "ps", "-a").stdout)
    assert [t["id"] for t in listed] == [task_id]
    table = hf(cluster, "ps", "-a").stdout.splitlines()
    assert table[0].split() == ["ID", "NAME", "STATUS", "NODE", "GPUS", "PRIORITY", "AGE"]
    assert table[1].split()[:4] == [task_id, "hello", "completed", "n1"]

    timeline = hf(cluster, "events", task_id)
    assert timeline.returncode == 0, timeline.stderr


def test_run_waits_and_exits_with_the_task_outcome(cluster: Cluster) -> None:
    cluster.start_agent("n1", "process")
    ok = hf(cluster, "run", "busybox", "--", "echo", "hi")
    assert ok.returncode == 0, ok.stderr
    assert "pending →" in ok.stderr and "completed (exit code 0)" in ok.stderr

    followed = hf(cluster, "run", "-f", "busybox", "--", "echo hi from the task")
    assert followed.returncode == 0, followed.stderr
    assert "hi from the task" in followed.stdout.splitlines()

    failed = hf(cluster, "run", "busybox", "--max-retries", "0", "--", "exit 3")
    assert failed.returncode == 1, failed.stderr
    assert "failed (exit code 3)" in failed.stderr


def test_stop_refusals_and_operator_views(cluster: Cluster) -> None:
    cluster.start_agent("n1", "process")
    task_id = hf(cluster, "run", "-d", "busybox", "--", "sleep 60").stdout.strip()
    cluster.wait_status(task_id, "running")
    assert task_id in hf(cluster, "ps").stdout

    stopped = hf(cluster, "stop", task_id)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() in (f"{task_id}: stopping", f"{task_id}: stopped")
    cluster.wait_status(task_id, "stopped")
    again = hf(cluster, "stop", task_id)
    assert again.returncode == 1 and "(code 40030)" in again.stderr

    refused = hf(cluster, "run", "--priority", "90", "busybox", "--", "true")
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: priority 90 is above 70")
    assert "(code 40003)" in refused.stderr

    missing = hf(cluster, "describe", "task-does-not-exist")
    assert missing.returncode == 4 and "(code 40401)" in missing.stderr

    waiting = hf(cluster, "run", "-d", "--gpus", "4", "busybox", "--", "true").stdout.strip()
    cluster.wait(lambda: bool(cluster.task(waiting)["pending_reason"]), "a pending reason")
    assert "Pending reason:" in hf(cluster, "describe", waiting).stdout

    nodes = hf(cluster, "nodes", token="operator_token")
    assert nodes.returncode == 0, nodes.stderr
    assert nodes.stdout.splitlines()[1].split()[:2] == ["n1", "online"]
    assert hf(cluster, "nodes").returncode == 1  # a tenant key is refused (403)

    groups = hf(cluster, "groups", "ls")
    assert groups.returncode == 0, groups.stderr

    gone = hf(cluster, "--server", "http://127.0.0.1:9", "ps")
    assert gone.returncode == 3 and "cannot reach" in gone.stderr
