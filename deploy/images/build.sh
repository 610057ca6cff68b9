#!/usr/bin/env bash
# Build the three images without a registry: the Debian base (cached), HeteroFlow on it from
# wheels built here, and NATS FROM scratch. Idempotent: a second run reuses the base and,
# when the sources did not change, every Docker layer.
#   deploy/images/build.sh [base|heteroflow|nats|all]
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
PYTHON="${PYTHON:-$repo/.venv/bin/python}"
[[ -x "$PYTHON" ]] || PYTHON=python3
BASE="${HF_BASE_IMAGE:-heteroflow/base:bookworm}"
TAG="${HF_IMAGE_TAG:-latest}"
what="${1:-all}"

base() { HF_BASE_IMAGE="$BASE" bash "$here/build-base.sh"; }

# The engine's notice that the legacy builder is deprecated (buildx is not installed here) is
# the same on every build: left out, so CI's log shows only what went wrong.
quiet() { grep -v 'legacy builder\|buildx\|^$' >&2 || true; }

heteroflow() {
    local ctx
    ctx="$(mktemp -d)"
    trap 'rm -rf "$ctx"' RETURN
    # Reproducible wheel (fixed timestamps), so unchanged sources give an identical layer.
    export SOURCE_DATE_EPOCH="$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 315532800)"
    # (pip's notes about the host's absent extra index paths are noise here)
    "$PYTHON" -m pip wheel --quiet --wheel-dir "$ctx/deps" "$repo" \
        2> >(grep -v '^WARNING: Location' >&2)
    mkdir -p "$ctx/app"
    mv "$ctx"/deps/heteroflow-*.whl "$ctx/app/"
    docker build --quiet --build-arg "BASE=$BASE" -f "$here/heteroflow.Dockerfile" \
        -t "heteroflow/heteroflow:$TAG" "$ctx" >/dev/null 2> >(quiet)
    echo "heteroflow: built heteroflow/heteroflow:$TAG"
}

nats() {
    local ctx bin
    ctx="$(mktemp -d)"
    trap 'rm -rf "$ctx"' RETURN
    bin="$("$PYTHON" -c 'from libs.embedded import nats_server_binary; print(nats_server_binary())' 2>/dev/null \
        || command -v nats-server)"
    cp "$bin" "$ctx/nats-server"
    docker build --quiet -f "$here/nats.Dockerfile" -t "heteroflow/nats:$TAG" "$ctx" >/dev/null \
        2> >(quiet)
    echo "nats: built heteroflow/nats:$TAG ($("$ctx/nats-server" --version))"
}

case "$what" in
    base) base ;;
    heteroflow) base && heteroflow ;;
    nats) nats ;;
    all) base && heteroflow && nats ;;
    *) echo "usage: $0 [base|heteroflow|nats|all]" >&2; exit 2 ;;
esac
