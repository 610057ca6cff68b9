"""Engine routing (SPEC §5): the engine profile of an inference task, from its image name and
the GPU vendor of its placement, and the engine-specific environment the profile sets.

The scheduler records the placement's `vendor/model` as the task's `gpu_label`; the agent
reads the vendor from it (or from its own inventory) and the engine from the image. The
profile's environment never overrides a value the user set. Pure; docs/serving.md.
"""

from __future__ import annotations

import re

from libs.domain.group.serving import image_repository

# Engine → whole words in the image repository that name it.
ENGINES: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm",),
    "sglang": ("sglang",),
    "mindie": ("mindie",),
    "llama.cpp": ("llama.cpp", "llama-cpp", "llama_cpp", "llamacpp"),
}

# Each vendor's variable naming the visible devices (the card indices granted).
VISIBLE_DEVICES: dict[str, tuple[str, ...]] = {
    "nvidia": ("CUDA_VISIBLE_DEVICES",),
    "amd": ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"),
    "huawei": ("ASCEND_RT_VISIBLE_DEVICES",),
    "intel": ("ZE_AFFINITY_MASK",),
}

# Engine- and vendor-specific settings beyond device visibility.
EXTRA_ENV: dict[tuple[str, str], dict[str, str]] = {
    ("vllm", "amd"): {"VLLM_USE_TRITON_FLASH_ATTN": "0"},
    ("vllm", "huawei"): {"VLLM_TARGET_DEVICE": "npu"},
    ("sglang", "amd"): {"SGLANG_USE_AITER": "1"},
    ("mindie", "huawei"): {"MINDIE_LOG_TO_STDOUT": "1"},
    ("llama.cpp", "nvidia"): {"GGML_CUDA_ENABLE_UNIFIED_MEMORY": "0"},
}


def _word(w: str) -> re.Pattern[str]:
    return re.compile(r"(?<![a-z0-9])" + re.escape(w) + r"(?![a-z0-9])")


_PATTERNS = {engine: tuple(_word(w) for w in words) for engine, words in ENGINES.items()}


def engine_of(image: str) -> str:
    """The engine an image runs ("" when its name names none of ours)."""
    repo = image_repository(image)
    for engine, patterns in _PATTERNS.items():
        if any(p.search(repo) for p in patterns):
            return engine
    return ""


def vendor_of(gpu_label: str, fallback: str = "") -> str:
    vendor = gpu_label.partition("/")[0].strip().lower()
    return vendor or fallback.lower()


def profile(image: str, gpu_label: str, gpu_ids: tuple[str, ...], vendor: str = "") -> str:
    """`engine@vendor` (e.g. `vllm@nvidia`), `engine` without a card, "" for no engine."""
    engine = engine_of(image)
    if not engine:
        return ""
    v = vendor_of(gpu_label, vendor)
    return f"{engine}@{v}" if v and gpu_ids else engine


def profile_env(name: str, gpu_ids: tuple[str, ...], indices: tuple[str, ...]) -> dict[str, str]:
    """The profile's environment: the vendor's visible-device variable(s) over the granted
    cards' indices, and the engine's vendor-specific settings."""
    engine, _, vendor = name.partition("@")
    if not engine or not vendor or not gpu_ids:
        return {}
    env = dict.fromkeys(VISIBLE_DEVICES.get(vendor, ()), ",".join(indices or gpu_ids))
    env.update(EXTRA_ENV.get((engine, vendor), {}))
    return env
