"""Engine routing: the profile from image and GPU vendor, and the environment it sets."""

from __future__ import annotations

import pytest

from agent.engines import profile, profile_env


@pytest.mark.parametrize(
    ("image", "label", "gpus", "vendor", "expected"),
    [
        ("vllm/vllm-openai:v0.6", "nvidia/A100-80GB", ("0",), "", "vllm@nvidia"),
        ("rocm/vllm:latest", "amd/MI300X", ("1",), "", "vllm@amd"),
        ("lmsysorg/sglang:v0.4", "", ("0",), "nvidia", "sglang@nvidia"),  # agent's inventory
        ("ascendhub/mindie:1.0", "huawei/Ascend910B", ("0", "1"), "", "mindie@huawei"),
        ("ghcr.io/ggerganov/llama.cpp:server", "", (), "", "llama.cpp"),  # CPU: no vendor
        ("busybox:latest", "nvidia/L4", ("0",), "", ""),  # not an engine we know
        ("myapp:vllm-fix", "nvidia/L4", ("0",), "", ""),  # the tag is not the engine
    ],
    ids=lambda v: str(v),
)
def test_profile(image: str, label: str, gpus: tuple[str, ...], vendor: str, expected: str) -> None:
    assert profile(image, label, gpus, vendor) == expected


def test_profile_env_sets_each_vendors_visible_devices() -> None:
    assert profile_env("vllm@nvidia", ("GPU-a", "GPU-b"), ("0", "1")) == {
        "CUDA_VISIBLE_DEVICES": "0,1"
    }
    amd = profile_env("vllm@amd", ("2",), ("2",))
    assert amd["HIP_VISIBLE_DEVICES"] == "2" and amd["ROCR_VISIBLE_DEVICES"] == "2"
    assert amd["VLLM_USE_TRITON_FLASH_ATTN"] == "0"
    assert (
        profile_env("mindie@huawei", ("0", "1"), ("0", "1"))["ASCEND_RT_VISIBLE_DEVICES"] == "0,1"
    )
    assert profile_env("llama.cpp", (), ()) == {}
    assert profile_env("", ("0",), ("0",)) == {}
