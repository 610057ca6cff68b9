#!/usr/bin/env bash
# The base image, from Debian packages without a registry: mmdebstrap (minbase) into a
# tarball, then `docker import`. Cached: an image whose label names the same suite and
# package list is reused, so a second run does nothing.
set -euo pipefail

SUITE="${HF_BASE_SUITE:-bookworm}"
# python3.11 for the wheel; tini reaps the agent's local processes; ca-certificates for TLS.
PACKAGES="${HF_BASE_PACKAGES:-python3,python3-venv,ca-certificates,tini}"
TAG="${HF_BASE_IMAGE:-heteroflow/base:$SUITE}"
WANT="$SUITE:$PACKAGES"

have="$(docker image inspect --format '{{ index .Config.Labels "org.heteroflow.base" }}' "$TAG" 2>/dev/null || true)"
if [[ "$have" == "$WANT" ]]; then
    echo "base: $TAG is up to date (cached)"
    exit 0
fi

command -v mmdebstrap >/dev/null || { echo "base: needs mmdebstrap (apt-get install mmdebstrap)" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# With no mirror given mmdebstrap uses the host's apt sources (a local mirror or proxy).
mmdebstrap --quiet --variant=minbase --include="$PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/{doc,man,locale}/*' \
    --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    "$SUITE" "$work/rootfs.tar"
docker import \
    --change "LABEL org.heteroflow.base=$WANT" \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    "$work/rootfs.tar" "$TAG" >/dev/null
echo "base: built $TAG ($(docker image inspect --format '{{.Size}}' "$TAG") bytes)"
