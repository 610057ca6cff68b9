"""`heteroflow pools|queues|jobs`, run as the installed console script against a real
control plane and a process-runtime agent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.wait import wait_until

from .cluster import Cluster
from .test_cli import hf

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_pools_queues_and_a_job_from_the_cli(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start_agent("n1", "process")
    pool = tmp_path / "pool.json"
    pool.write_text(json.dumps({"name": "all", "node_selector": {}}))
    made = hf(cluster, "pools", "create", str(pool), token="operator_token")
    assert made.returncode == 0, made.stderr
    assert "all" in made.stdout and "n1" in made.stdout
    queue = tmp_path / "queue.json"
    queue.write_text(json.dumps({"name": "q", "tenant": "default", "pools": ["all"]}))
    assert hf(cluster, "queues", "create", str(queue), token="operator_token").returncode == 0

    job = tmp_path / "job.json"
    job.write_text(
        json.dumps(
            {
                "name": "two",
                "queue": "q",
                "tasks": [
                    {"key": "a", "name": "a", "command": "echo a"},
                    {"key": "b", "name": "b", "command": "echo b"},
                ],
                "dependencies": [{"task": "b", "on": "a"}],
            }
        )
    )
    submitted = hf(cluster, "-o", "json", "jobs", "submit", str(job))
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["id"]
    shown: dict[str, Any] = {}

    def succeeded() -> bool:
        shown.update(json.loads(hf(cluster, "-o", "json", "jobs", "describe", job_id).stdout))
        return bool(shown["status"] == "succeeded")

    wait_until(succeeded, 60, 0.5, lambda: f"the job succeeded: {shown}")
    table = hf(cluster, "jobs", "describe", job_id)
    assert table.returncode == 0 and "KEY" in table.stdout and "after:a" in table.stdout
    listed = hf(cluster, "queues", "describe", "q")
    assert listed.returncode == 0 and "Pending" in listed.stdout, listed.stderr
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x", "tasks": [{"key": "a", "name": "a"}], "queue": "no"}))
    refused = hf(cluster, "jobs", "submit", str(bad))
    assert refused.returncode != 0 and "unknown queue 'no'" in refused.stderr
