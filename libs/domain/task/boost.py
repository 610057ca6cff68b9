"""Memory boost (SPEC §4): GPU inference servers need more host memory than the default.

A task that runs a known GPU inference image and still asks for the default host memory gets
the boosted amount instead; any other value is kept. The rule is applied when the task is
created (`libs.domain.task.parse_create`), so the spec the scheduler places by is what the
container gets: a node's memory is never over-committed by a boost at start. Pure functions.
"""

from __future__ import annotations

import re

DEFAULT_MEMORY_MB = 2048  # a task's host memory when it names none (libs.domain.task)
BOOSTED_MEMORY_MB = 8192

# Names of GPU inference servers, matched as whole words in the image repository path (the
# registry host and the tag are ignored: `myapp:vllm-fix` is not vLLM).
INFERENCE_IMAGE_NAMES: tuple[str, ...] = (
    "vllm",
    "llama.cpp",
    "llama-cpp",
    "llama_cpp",
    "llamacpp",
    "sglang",
    "text-generation-inference",
    "tgi",
    "tensorrt-llm",
    "tensorrt_llm",
    "tensorrtllm",
    "trtllm",
    "lmdeploy",
    "mindie",
    "ollama",
    "triton",
    "tritonserver",
)

_INFERENCE = re.compile(
    r"(?<![a-z0-9])(?:" + "|".join(re.escape(n) for n in INFERENCE_IMAGE_NAMES) + r")(?![a-z0-9])"
)


def image_repository(image: str) -> str:
    """`registry:5000/org/name:tag@sha256:…` → `org/name` (lowercase)."""
    ref = image.strip().lower().split("@", 1)[0]
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    if colon > slash:
        ref = ref[:colon]
    parts = ref.split("/")
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        parts = parts[1:]  # a registry host, not part of the name
    return "/".join(parts)


def is_gpu_inference_image(image: str) -> bool:
    return _INFERENCE.search(image_repository(image)) is not None


def boost_memory(
    image: str,
    memory_mb: int,
    uses_gpu: bool,
    default: int = DEFAULT_MEMORY_MB,
    boosted: int = BOOSTED_MEMORY_MB,
) -> tuple[int, str | None]:
    """The memory to run with, and the log line when it was boosted.

    `uses_gpu`: the task asks for whole cards or a fraction. Only a GPU task on an inference
    image still at `default` is boosted; every other case returns `memory_mb` unchanged.
    """
    if uses_gpu and memory_mb == default and boosted > default and is_gpu_inference_image(image):
        return boosted, f"Auto-boost GPU inference memory: {default} → {boosted}MB"
    return memory_mb, None
