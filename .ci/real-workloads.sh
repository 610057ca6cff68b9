#!/usr/bin/env bash
# Real software for the end-to-end tests of tests/integration/test_e2e_real_*.py, cached where
# the machine keeps it between runs (HETEROFLOW_TEST_CACHE, default /var/cache/heteroflow):
#   * llama-cpp-python (llama.cpp's OpenAI server): built from source once into a wheel
#     (~4 min on 2 cores), then installed from that wheel with its [server] extra (seconds);
#   * JAX on CPU: `pip install --target` once (~600 MB), given to tasks by PYTHONPATH;
#   * the Debian python image for JAX in a container: the base image deploy/images/build.sh
#     builds (cached by its label), built here only when missing.
# Not fatal for CI: whatever is missing makes its tests skip, naming what is missing.
#   .ci/real-workloads.sh            (run from the repository, venv in .venv)
set -uo pipefail
cd "$(dirname "$0")/.."

CACHE="${HETEROFLOW_TEST_CACHE:-/var/cache/heteroflow}"
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
LLAMA_VERSION="${HF_LLAMA_CPP_VERSION:-0.3.36}"
JAX_VERSION="${HF_JAX_VERSION:-0.10.2}"
# pip's notes about the host's absent extra index paths are noise here
quiet() { grep -v '^WARNING: Location' >&2 || true; }
status=0

# llama.cpp is compiled for this CPU's instruction set: its wheel is kept per set of CPU
# flags, so a cache that moves to another machine is rebuilt, not run into SIGILL.
WHEELS="$CACHE/wheels/cpu-$(grep -m1 '^flags' /proc/cpuinfo | md5sum | cut -c1-12)"
mkdir -p "$WHEELS" || { echo "real-workloads: cannot write $CACHE" >&2; exit 1; }

# llama.cpp's server
wheel="$(ls "$WHEELS/llama_cpp_python-$LLAMA_VERSION"-*.whl 2>/dev/null | head -n 1)"
if [[ -z "$wheel" ]]; then
    started=$SECONDS
    # One compile job per core. pip writes the wheel whole at the end: a failed build
    # leaves nothing in the cache.
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "${PIP[@]}" wheel --no-deps -w "$WHEELS" \
        "llama-cpp-python==$LLAMA_VERSION" 2> >(quiet) >/dev/null
    wheel="$(ls "$WHEELS/llama_cpp_python-$LLAMA_VERSION"-*.whl 2>/dev/null | head -n 1)"
    echo "real-workloads: llama-cpp-python $LLAMA_VERSION built in $((SECONDS - started)) s"
fi
if [[ -n "$wheel" ]]; then
    have="$(.venv/bin/python -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null)"
    if [[ "$have" != "$LLAMA_VERSION" ]] || ! .venv/bin/python -c 'import sse_starlette' 2>/dev/null; then
        "${PIP[@]}" install "$wheel[server]" 2> >(quiet) >/dev/null || status=1
    fi
    echo "real-workloads: llama-cpp-python $(.venv/bin/python -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null || echo 'not installed')"
else
    echo "real-workloads: llama-cpp-python build failed; the llama.cpp tests will skip" >&2
    status=1
fi

# JAX on CPU, for PYTHONPATH (host processes and containers alike)
if [[ ! -f "$CACHE/jax/jax/__init__.py" ]]; then
    started=$SECONDS
    rm -rf "$CACHE/jax.partial"
    if "${PIP[@]}" install --target "$CACHE/jax.partial" "jax==$JAX_VERSION" "jaxlib==$JAX_VERSION" \
        2> >(quiet) >/dev/null; then
        rm -rf "$CACHE/jax" && mv "$CACHE/jax.partial" "$CACHE/jax"
        echo "real-workloads: jax $JAX_VERSION installed in $((SECONDS - started)) s"
    else
        echo "real-workloads: jax install failed; the JAX tests will skip" >&2
        status=1
    fi
fi

# The Debian python image (the compose test's base; a no-op when it is already built)
if docker info >/dev/null 2>&1 && command -v mmdebstrap >/dev/null 2>&1; then
    bash deploy/images/build.sh base >/dev/null || status=1
fi
exit "$status"
