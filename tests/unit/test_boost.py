"""Agent memory boost (SPEC §4): which images are GPU inference servers, and when memory moves."""

from __future__ import annotations

import pytest

from agent.boost import boost_memory, image_repository, is_gpu_inference_image

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
