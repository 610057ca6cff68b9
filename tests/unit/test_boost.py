"""Memory boost (SPEC §4): which images are GPU inference servers, and when memory moves."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from agent.inventory import Inventory
from agent.launch import run_spec
from libs.domain.protocol import CommandKind, NodeCommand, TaskRunSpec
from libs.domain.task.boost import boost_memory, image_repository, is_gpu_inference_image
from libs.domain.task.model import (
    Task,
    TaskId,
    TaskSpec,
    TaskType,
    TenantId,
    boost_line,
    parse_create,
    parse_update,
)
from libs.domain.task.states import TaskStatus
from services.scheduler.placement.model import Requirement

LINE = "Auto-boost GPU inference memory: 2048 → 8192MB"


@pytest.mark.parametrize(
    ("image", "memory_mb", "uses_gpu", "expected"),
    [
        ("vllm/vllm-openai:v0.6.3", 2048, True, (8192, LINE)),
        ("ghcr.io/ggerganov/llama.cpp:server-cuda", 2048, True, (8192, LINE)),
        ("ghcr.io/abetlen/llama-cpp-python:latest", 2048, True, (8192, LINE)),
        ("myorg/llamacpp-server", 2048, True, (8192, LINE)),
        ("lmsysorg/sglang:latest", 2048, True, (8192, LINE)),
        ("ghcr.io/huggingface/text-generation-inference:2.4", 2048, True, (8192, LINE)),
        ("registry.local:5000/tgi:1", 2048, True, (8192, LINE)),
        ("nvcr.io/nvidia/tensorrt-llm/release:0.15", 2048, True, (8192, LINE)),
        ("openmmlab/lmdeploy:v0.6", 2048, True, (8192, LINE)),
        ("swr.cn-south-1.myhuaweicloud.com/ascendhub/mindie:1.0", 2048, True, (8192, LINE)),
        ("ollama/ollama", 2048, True, (8192, LINE)),
        ("nvcr.io/nvidia/tritonserver:24.08-py3", 2048, True, (8192, LINE)),
        ("VLLM/VLLM-OPENAI:LATEST", 2048, True, (8192, LINE)),
        ("vllm/vllm-openai@sha256:" + "a" * 64, 2048, True, (8192, LINE)),
        # an explicit value is kept, larger or smaller
        ("vllm/vllm-openai", 16384, True, (16384, None)),
        ("vllm/vllm-openai", 4096, True, (4096, None)),
        ("vllm/vllm-openai", 1024, True, (1024, None)),
        # no GPU: not a GPU inference task
        ("vllm/vllm-openai", 2048, False, (2048, None)),
        # not an inference image
        ("pytorch/pytorch:2.4.0-cuda12.1", 2048, True, (2048, None)),
        ("busybox:latest", 2048, True, (2048, None)),
        ("myapp:vllm-fix", 2048, True, (2048, None)),  # the tag does not count
        ("myorg/myvllmish", 2048, True, (2048, None)),  # whole words only
        ("vllm.example.com/trainer:1", 2048, True, (2048, None)),  # the registry does not count
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_boost_memory(
    image: str, memory_mb: int, uses_gpu: bool, expected: tuple[int, str | None]
) -> None:
    assert boost_memory(image, memory_mb, uses_gpu) == expected


def test_log_line_is_exact() -> None:
    _, line = boost_memory("vllm/vllm-openai", 2048, True)
    assert line == "Auto-boost GPU inference memory: 2048 → 8192MB"


def test_custom_default_and_target() -> None:
    assert boost_memory("ollama/ollama", 1024, True, default=1024, boosted=4096) == (
        4096,
        "Auto-boost GPU inference memory: 1024 → 4096MB",
    )


@pytest.mark.parametrize(
    ("image", "repository"),
    [
        ("busybox", "busybox"),
        ("busybox:latest", "busybox"),
        ("localhost:5000/team/app:1.2", "team/app"),
        ("ghcr.io/org/app@sha256:abc", "org/app"),
        ("docker.io/library/ubuntu:24.04", "library/ubuntu"),
    ],
)
def test_image_repository(image: str, repository: str) -> None:
    assert image_repository(image) == repository


def test_is_gpu_inference_image_is_case_insensitive() -> None:
    assert is_gpu_inference_image("Ollama/Ollama:0.3")
    assert not is_gpu_inference_image("")


# --- applied at creation, so placement counts it ------------------------------------------

VLLM = {"name": "srv", "image": "vllm/vllm-openai:v0.6.3", "gpu_required": 1}


@pytest.mark.parametrize(
    ("body", "memory"),
    [
        (VLLM, 8192),
        (VLLM | {"memory_mb": 2048}, 8192),  # still the default
        (VLLM | {"memory_mb": 4096}, 4096),
        ({"name": "srv", "image": "vllm/vllm-openai", "gpu_memory_mb": 4096}, 8192),
        ({"name": "srv", "image": "vllm/vllm-openai"}, 2048),  # no GPU
        ({"name": "x", "image": "busybox", "gpu_required": 1}, 2048),
    ],
    ids=["default", "explicit-default", "chosen", "fraction", "no-gpu", "not-inference"],
)
def test_create_applies_the_boost_the_scheduler_counts(body: dict[str, Any], memory: int) -> None:
    spec = parse_create(body, tenant=True)
    assert spec.memory_mb == memory
    assert Requirement.from_spec(spec).memory_mb == memory


def test_create_names_the_exact_line_only_when_it_boosted() -> None:
    assert boost_line(VLLM, parse_create(VLLM, tenant=True)) == LINE
    chosen = VLLM | {"memory_mb": 4096}
    assert boost_line(chosen, parse_create(chosen, tenant=True)) is None


def test_update_to_an_inference_image_boosts_a_pending_task() -> None:
    now = datetime.now(UTC)
    spec = parse_create({"name": "x", "image": "busybox", "gpu_required": 1}, tenant=True)
    task = Task(id=TaskId("t"), tenant_id=TenantId("a"), spec=spec, created_at=now, updated_at=now)
    new, changes = parse_update(task, {"image": "ollama/ollama"}, tenant=True)
    assert new.memory_mb == 8192 and changes["memory_mb"] == 8192


def test_agent_runs_the_placed_memory_without_boosting_again() -> None:
    # A spec that reached the node at 2048 (placed before the boost moved to creation) runs
    # with 2048: the node never gives a container more than the scheduler counted.
    spec = TaskSpec(name="srv", image="vllm/vllm-openai", gpu_required=1)
    inventory = Inventory(node_id="n1", hostname="h", memory_mb=65536, cpu_cores=8)
    cmd = NodeCommand(
        kind=CommandKind.START,
        node_id="n1",
        task_id="t",
        attempt=0,
        status=TaskStatus.SCHEDULED,
        run=TaskRunSpec(spec=spec, gpu_ids=("g0",), tenant_id="a"),
    )
    run, _ = run_spec(cmd, inventory, "n1", "127.0.0.1", "process")
    assert run.memory_mb == 2048
    placed = parse_create(VLLM, tenant=True)
    run, _ = run_spec(
        cmd.model_copy(update={"run": TaskRunSpec(spec=placed, gpu_ids=("g0",))}),
        inventory,
        "n1",
        "127.0.0.1",
        "process",
    )
    assert run.memory_mb == 8192


# --- the agent's start: inference runs without a running timeout -------------------------


@pytest.mark.parametrize(
    ("task_type", "image", "timeout"),
    [
        ("inference", "busybox", 0.0),
        ("", "vllm/vllm-openai", 0.0),  # the image makes it inference when task_type is ""
        ("batch", "vllm/vllm-openai", 5.0),  # task_type is authoritative
        ("training", "busybox", 5.0),
    ],
)
def test_inference_is_exempt_from_the_timeout(task_type: str, image: str, timeout: float) -> None:
    spec = TaskSpec(name="x", image=image, timeout=5, task_type=TaskType(task_type))
    cmd = NodeCommand(
        kind=CommandKind.START,
        node_id="n1",
        task_id="t",
        attempt=0,
        status=TaskStatus.SCHEDULED,
        run=TaskRunSpec(spec=spec),
    )
    inventory = Inventory(node_id="n1", hostname="h", memory_mb=4096, cpu_cores=2)
    assert run_spec(cmd, inventory, "n1", "127.0.0.1", "process")[1] == timeout
