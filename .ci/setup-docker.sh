#!/usr/bin/env bash
# Make a Docker engine answer on this host and provide the local test images, with no registry.
#
# Idempotent; runs as root. Steps, each skipped when already done:
#   1. install docker.io / busybox-static when missing (one `apt-get update`),
#   2. start `dockerd --iptables=false` in the background (log: /tmp/dockerd.log) and wait for it,
#   3. build `busybox:latest` from the static busybox binary (`docker import`, no pull),
#   4. tag it `heteroflow/test:latest` as well.
set -euo pipefail

DOCKERD_LOG=${DOCKERD_LOG:-/tmp/dockerd.log}
WAIT_S=${DOCKER_WAIT_S:-60}
BUSYBOX_BIN=/bin/busybox
IMAGE=busybox:latest
TEST_IMAGE=heteroflow/test:latest

log() { echo "setup-docker: $*" >&2; }

apt_updated=0
apt_install() {
    # Install only the named packages; refresh the package lists at most once.
    if [ "$apt_updated" -eq 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

engine_answers() { docker info >/dev/null 2>&1; }

ensure_packages() {
    local missing=()
    command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
    command -v docker >/dev/null 2>&1 || missing+=(docker.io)
    [ -x "$BUSYBOX_BIN" ] || missing+=(busybox-static)
    if [ "${#missing[@]}" -gt 0 ]; then
        # de-duplicate (docker.io may be listed twice)
        mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
        log "installing ${missing[*]}"
        apt_install "${missing[@]}"
    fi
}

start_engine() {
    if engine_answers; then
        log "engine already answers"
        return
    fi
    ensure_packages
    if ! pgrep -x dockerd >/dev/null 2>&1; then
        log "starting dockerd (log: $DOCKERD_LOG)"
        nohup dockerd --iptables=false >"$DOCKERD_LOG" 2>&1 &
    fi
    local waited=0
    until engine_answers; do
        if [ "$waited" -ge "$WAIT_S" ]; then
            log "dockerd did not answer within ${WAIT_S}s; last log lines:"
            tail -n 30 "$DOCKERD_LOG" >&2 || true
            exit 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
    log "engine answers after ${waited}s"
}

image_present() { docker image inspect "$1" >/dev/null 2>&1; }

build_busybox_image() {
    if image_present "$IMAGE"; then
        log "$IMAGE present"
        return
    fi
    [ -x "$BUSYBOX_BIN" ] || apt_install busybox-static
    local root
    root=$(mktemp -d)
    # shellcheck disable=SC2064
    trap "rm -rf '$root'" EXIT
    mkdir -p "$root"/bin "$root"/sbin "$root"/usr/bin "$root"/usr/sbin \
        "$root"/tmp "$root"/etc "$root"/proc "$root"/sys "$root"/dev "$root"/root
    chmod 1777 "$root/tmp"
    cp "$BUSYBOX_BIN" "$root/bin/busybox"
    # `--list-full` gives each applet's canonical directory (bin/sh, usr/bin/head, ...).
    local applet
    while read -r applet; do
        [ -n "$applet" ] || continue
        [ "$applet" = "bin/busybox" ] && continue
        mkdir -p "$root/$(dirname "$applet")"
        ln -sf /bin/busybox "$root/$applet"
    done < <("$BUSYBOX_BIN" --list-full)
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' \
        >"$root/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
    log "importing $IMAGE"
    tar -C "$root" -c . | docker import \
        --change 'CMD ["sh"]' \
        --change 'ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin' \
        - "$IMAGE" >/dev/null
    rm -rf "$root"
    trap - EXIT
}

start_engine
build_busybox_image
if ! image_present "$TEST_IMAGE"; then
    docker tag "$IMAGE" "$TEST_IMAGE"
    log "tagged $TEST_IMAGE"
fi
log "ready: $(docker version --format '{{.Server.Version}}') with $IMAGE and $TEST_IMAGE"
