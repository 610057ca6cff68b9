"""Engine routing end to end: the placement's GPU label reaches the agent, which applies the
engine profile's environment; both show in GET /tasks/{id}."""

from __future__ import annotations

import pytest

from . import web
from .cluster import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_placement_label_and_engine_profile(cluster: Cluster) -> None:
    cluster.start_agent("g1", "process", HETEROFLOW_DECLARED_GPUS="nvidia:L4:23034x2")
    t = cluster.create(
        image="vllm/vllm-openai:v0.6",
        task_type="inference",
        gpu_required=1,
        memory_mb=256,
        command="echo VISIBLE=$CUDA_VISIBLE_DEVICES; sleep 300",
    )
    running = cluster.wait_status(t["id"], "running", timeout=30)
    assert running["gpu_label"] == "nvidia/L4", running
    assert running["engine"] == "vllm@nvidia", running

    def logged() -> bool:
        r = web.get(f"{cluster.url}/api/v1/tasks/{t['id']}/logs", headers=cluster.tenant)
        return any(line.startswith("VISIBLE=") for line in r.json().get("logs", []))

    cluster.wait(logged, "the task's output")
    r = web.get(f"{cluster.url}/api/v1/tasks/{t['id']}/logs", headers=cluster.tenant)
    line = next(x for x in r.json()["logs"] if x.startswith("VISIBLE="))
    assert line.removeprefix("VISIBLE=") == running["gpu_ids"][0], line
    # A task that is not inference gets no profile.
    other = cluster.create(image="busybox:latest", gpu_required=1, command="sleep 300")
    assert cluster.wait_status(other["id"], "running")["engine"] == ""
