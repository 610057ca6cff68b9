"""Real software for end-to-end tests, without a download at test time: llama.cpp's OpenAI
server (llama-cpp-python), JAX on CPU, and a tiny random-weight llama model written here.

.ci/real-workloads.sh installs llama-cpp-python into the venv from a cached wheel and JAX
into a cached directory; on a machine without them the tests that need them skip, naming
what is missing and how to get it.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# Where .ci/real-workloads.sh keeps what it builds between CI runs.
CACHE = Path(os.environ.get("HETEROFLOW_TEST_CACHE", "/var/cache/heteroflow"))
# `pip install --target` of jax and jaxlib (CPU wheels), for PYTHONPATH.
JAX_DIR = Path(os.environ.get("HETEROFLOW_TEST_JAX_DIR", str(CACHE / "jax")))
# A Debian bookworm image with python3 (3.11, like the host's: the JAX wheels match); the
# compose test's base image is one (deploy/images/build-base.sh).
PYTHON_IMAGE = os.environ.get("HETEROFLOW_TEST_PYTHON_IMAGE", "heteroflow/base:bookworm")
PYTHON = sys.executable
SETUP = "bash .ci/real-workloads.sh"


def llama_server_missing() -> str:
    """Why llama.cpp's server cannot run here ("" when it can)."""
    for module in ("llama_cpp", "gguf", "openai", "sse_starlette", "starlette_context"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed in this venv ({SETUP} installs it)"
    return ""


def jax_missing() -> str:
    """Why JAX cannot be given to a task here ("" when it can)."""
    if not (JAX_DIR / "jax" / "__init__.py").exists() or not (JAX_DIR / "jaxlib").is_dir():
        return f"no JAX under {JAX_DIR} ({SETUP} installs it there)"
    return ""


def python_image_missing() -> str:
    """Why the Debian python image is not there ("" when it is)."""
    try:
        done = subprocess.run(
            ["docker", "image", "inspect", PYTHON_IMAGE],
            capture_output=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"docker image inspect failed: {exc}"
    if done.returncode != 0:
        return f"no image {PYTHON_IMAGE} (deploy/images/build.sh base builds it)"
    return ""


requires_llama_server = pytest.mark.skipif(
    bool(llama_server_missing()), reason=llama_server_missing() or "-"
)
requires_jax = pytest.mark.skipif(bool(jax_missing()), reason=jax_missing() or "-")


# --- a tiny llama, random weights ------------------------------------------------------------

N_EMBD, N_LAYER, N_HEAD, N_FF, N_CTX = 64, 2, 4, 128, 256
# SentencePiece with byte fallback: unknown, begin, end, the 256 bytes, a few pieces.
PIECES = ["▁", "▁the", "▁a", "e", "t", "a", "o", "n", "s", "▁hello", "▁world", "."]


def write_tiny_llama(path: Path, seed: int) -> Path:
    """A llama-architecture GGUF of ~0.5 MB that llama.cpp loads and generates from."""
    import gguf
    import numpy as np

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + PIECES
    types = (
        [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
        + [gguf.TokenType.BYTE] * 256
        + [gguf.TokenType.NORMAL] * len(PIECES)
    )
    scores = [0.0] * 259 + [-float(i) for i in range(len(PIECES))]
    n_vocab = len(tokens)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"tiny-llama-{seed}")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)

    rng = np.random.default_rng(seed)

    def rand(*shape: int) -> np.ndarray[Any, Any]:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    ones = np.ones(N_EMBD, dtype=np.float32)
    # numpy shapes are GGUF's dimensions reversed: (rows, columns) = (out, in).
    w.add_tensor("token_embd.weight", rand(n_vocab, N_EMBD))
    for i in range(N_LAYER):
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"blk.{i}.{name}.weight", rand(N_EMBD, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        w.add_tensor(f"blk.{i}.ffn_gate.weight", rand(N_FF, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_up.weight", rand(N_FF, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_down.weight", rand(N_EMBD, N_FF))
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", rand(n_vocab, N_EMBD))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def llama_server_command(model: str, alias: str, port: str = "$PORT") -> str:
    """The replica's command on the process runtime: the venv's llama.cpp server on the
    allocated port of every address (the router reaches it at the node's advertised
    address), one thread (the test machine has two cores)."""
    return (
        f"exec {PYTHON} -m llama_cpp.server --model {model} --model_alias {alias} "
        f"--host 0.0.0.0 --port {port} --n_ctx {N_CTX} --n_threads 1 --n_batch 64"
    )


# --- a JAX world of two processes -------------------------------------------------------------

ALLGATHER = """
import os
import resource

# What bounds this process: an address-space limit, and the memory cap of its cgroup(s).
soft = resource.getrlimit(resource.RLIMIT_AS)[0]
print("address-space", "unlimited" if soft == resource.RLIM_INFINITY else soft, flush=True)
caps = []
for line in open("/proc/self/cgroup"):
    _, controllers, path = line.rstrip().split(":", 2)
    if controllers == "":
        files = ["/sys/fs/cgroup" + path + "/memory.max"]
        files.append("/sys/fs/cgroup/unified" + path + "/memory.max")
    elif "memory" in controllers.split(","):
        files = ["/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes"]
    else:
        continue
    caps += [open(f).read().strip() for f in files if os.path.exists(f)]
print("memory-cap", " ".join(caps) or "none", flush=True)

import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
env = os.environ
coordinator = env["MASTER_ADDR"] + ":" + env["MASTER_PORT"]
print("coordinator", coordinator, flush=True)
jax.distributed.initialize(
    coordinator,
    int(env["WORLD_SIZE"]),
    int(env["RANK"]),
    initialization_timeout=90,
)
import jax.numpy as jnp
from jax.experimental import multihost_utils
rank = int(env["RANK"])
out = multihost_utils.process_allgather(jnp.array([float(rank) + 1.0]))
print("allgather", [float(x) for x in out.reshape(-1)], "rank", rank, flush=True)
jax.distributed.shutdown()
"""


def allgather_command(python: str) -> str:
    """A shell command running the all-gather with `python` (JAX on its PYTHONPATH)."""
    assert "'" not in ALLGATHER
    return f"exec {python} -c '{ALLGATHER.strip()}'"
