"""Jobs end to end with real containers (SPEC §7): a three-stage pipeline passing files, a
conditional branch chosen by a reported metric, and a data dependency that runs after its
producer failed with the artifact complete."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.wait import wait_until

from . import web
from .cluster import Cluster
from .conftest import requires_docker

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.docker, requires_docker]

JOB_TERMINAL = {"succeeded", "failed", "stopped"}


@pytest.fixture
def shared() -> Iterator[Path]:
    """A host directory under the default volume allow-list (`/tmp/heteroflow/{tenant}`, the
    `default` tenant of `heteroflow up`), writable from the containers."""
    path = Path("/tmp/heteroflow/default") / f"job-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    os.chmod(path, 0o777)
    yield path
    for f in path.iterdir():
        f.unlink()
    path.rmdir()


def submit(cluster: Cluster, body: dict[str, Any]) -> dict[str, Any]:
    r = web.post(f"{cluster.url}/api/v1/jobs", json=body, headers=cluster.tenant)
    assert r.status_code == 201, r.text
    return dict(r.json())


def job(cluster: Cluster, job_id: str) -> dict[str, Any]:
    r = web.get(f"{cluster.url}/api/v1/jobs/{job_id}", headers=cluster.tenant)
    assert r.status_code == 200, r.text
    return dict(r.json())


def wait_job(cluster: Cluster, job_id: str, timeout: float = 120) -> dict[str, Any]:
    now: dict[str, Any] = {}

    def finished() -> dict[str, Any] | None:
        now.update(job(cluster, job_id))
        return now if now["status"] in JOB_TERMINAL else None

    return wait_until(
        finished,
        timeout,
        0.3,
        lambda: f"job {job_id} finished: {now}\n{cluster.log('control')[-3000:]}",
    )


def stage(key: str, command: str, volume: Path, **extra: Any) -> dict[str, Any]:
    return {
        "key": key,
        "name": key,
        "image": "busybox:latest",
        "command": command,
        "volumes": [{"host_path": str(volume), "container_path": "/work"}],
        "max_retries": 0,
    } | extra


def test_prep_train_eval_pass_files_in_order(cluster: Cluster, shared: Path) -> None:
    cluster.start_agent("n1", "docker")
    body = {
        "name": "pipeline",
        "tasks": [
            stage("prep", "echo data-42 > /work/prep.txt", shared),
            stage(
                "train",
                "cat /work/prep.txt > /work/model.txt && echo trained >> /work/model.txt",
                shared,
            ),
            stage(
                "eval",
                "grep -q data-42 /work/model.txt && grep -q trained /work/model.txt"
                " && echo ok > /work/eval.txt",
                shared,
            ),
        ],
        "dependencies": [{"task": "train", "on": "prep"}, {"task": "eval", "on": "train"}],
    }
    created = submit(cluster, body)
    assert [t["status"] for t in created["tasks"]] == ["pending", "waiting", "waiting"]
    assert created["tasks"][2]["why"] == "waiting for 'train' to complete"
    done = wait_job(cluster, created["id"])
    assert done["status"] == "succeeded", done
    assert (shared / "eval.txt").read_text().strip() == "ok"
    tasks = {t["key"]: t["task"] for t in done["tasks"]}
    assert all(t["status"] == "completed" for t in tasks.values())
    # The DAG view shows the order by times: each stage started after the one before ended.
    assert tasks["prep"]["finished_at"] <= tasks["train"]["started_at"]
    assert tasks["train"]["finished_at"] <= tasks["eval"]["started_at"]
    events = web.get(f"{cluster.url}/api/v1/jobs/{created['id']}/events", headers=cluster.tenant)
    types = [e["type"] for e in events.json()["events"]]
    assert types[0] == "job_submitted" and types.count("job_node_settled") == 3


@pytest.mark.parametrize(
    ("accuracy", "runs", "skipped"), [(0.97, "export", "tune"), (0.80, "tune", "export")]
)
def test_condition_takes_one_branch(
    cluster: Cluster, shared: Path, accuracy: float, runs: str, skipped: str
) -> None:
    cluster.start_agent("n1", "docker")
    report = f"echo 'HF_METRICS {{\"accuracy\": {accuracy}}}'"
    body = {
        "name": "branches",
        "tasks": [
            stage("train", report, shared, metrics=["accuracy"]),
            stage("export", "echo export > /work/export.txt", shared),
            stage("tune", "echo tune > /work/tune.txt", shared),
        ],
        "dependencies": [
            {"task": "export", "on": "train", "kind": "condition", "condition": "accuracy > 0.95"},
            {"task": "tune", "on": "train", "kind": "condition", "condition": "accuracy <= 0.95"},
        ],
    }
    done = wait_job(cluster, submit(cluster, body)["id"])
    nodes = {t["key"]: t for t in done["tasks"]}
    assert done["status"] == "succeeded", done
    assert nodes[runs]["status"] == "completed" and (shared / f"{runs}.txt").exists()
    assert nodes[skipped]["status"] == "skipped" and nodes[skipped]["task"] is None
    assert "is false" in nodes[skipped]["why"]
    assert not (shared / f"{skipped}.txt").exists()
    assert nodes["train"]["metrics"] == {"accuracy": accuracy}


def test_data_dependency_runs_after_a_failure_with_the_artifact(
    cluster: Cluster, shared: Path
) -> None:
    cluster.start_agent("n1", "docker")
    body = {
        "name": "salvage",
        "tasks": [
            stage("a", "echo ckpt-7 > /work/ckpt && echo HF_ARTIFACT /work/ckpt && exit 3", shared),
            stage("b", "grep -q ckpt-7 /work/ckpt && echo resumed > /work/b.txt", shared),
        ],
        "dependencies": [{"task": "b", "on": "a", "kind": "data", "artifact": "/work/ckpt"}],
    }
    done = wait_job(cluster, submit(cluster, body)["id"])
    nodes = {t["key"]: t for t in done["tasks"]}
    assert nodes["a"]["status"] == "failed" and nodes["a"]["artifacts"] == ["/work/ckpt"]
    assert nodes["b"]["status"] == "completed", done
    assert (shared / "b.txt").read_text().strip() == "resumed"
    assert done["status"] == "succeeded"  # a's failure was consumed by its data dependant
