"""Hardened tenant containers on a real Docker engine: the image's user with Docker's default
capabilities less the risky ones, a forced uid (with none) where the operator asks, except for
the tenants allowed the image's, read-only root with a tmpfs /tmp, an open-files limit, and one
network per tenant that no other tenant's container can reach."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator

import docker
import docker.errors
import pytest

from agent.runtimes.base import (
    KEPT_CAPABILITIES,
    LABEL_MANAGED,
    LABEL_TASK_ID,
    RunSpec,
    RuntimeFault,
)
from agent.runtimes.docker import DockerRuntime
from agent.runtimes.networks import CHAIN, bridge_name, network_name, unisolate

pytestmark = [pytest.mark.integration, pytest.mark.docker]

IMAGE = "busybox:latest"
RUN = uuid.uuid4().hex[:8]
TENANTS = (f"a{RUN}", f"b{RUN}")


@pytest.fixture(scope="module")
def engine() -> Iterator[docker.DockerClient]:
    if not DockerRuntime.available():
        pytest.skip("no Docker engine answers (run .ci/setup-docker.sh as root to start one)")
    client = docker.from_env()
    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        pytest.skip(f"{IMAGE} is not built (run .ci/setup-docker.sh)")
    yield client
    for c in client.containers.list(all=True, filters={"label": f"{LABEL_MANAGED}=true"}):
        if c.labels.get(LABEL_TASK_ID, "").startswith(f"h{RUN}"):
            c.remove(force=True)
    for tenant in TENANTS:
        for net in client.networks.list(names=[network_name(tenant)]):
            net.remove()
        with contextlib.suppress(RuntimeFault):
            unisolate(bridge_name(tenant))
    client.close()


@pytest.fixture
async def make(engine: docker.DockerClient) -> AsyncIterator[type[DockerRuntime]]:
    made: list[DockerRuntime] = []

    class Made(DockerRuntime):
        def __init__(self, **kw: object) -> None:
            super().__init__(wait_poll_s=1.0, **kw)  # type: ignore[arg-type]
            made.append(self)

    yield Made
    for runtime in made:
        await runtime.close()


def spec(command: str, tenant: str = TENANTS[0], **kw: object) -> RunSpec:
    return RunSpec.model_validate(
        {
            "task_id": f"h{RUN}-{uuid.uuid4().hex[:8]}",
            "attempt": 0,
            "image": IMAGE,
            "command": command,
            "memory_mb": 64,
            "cpu_cores": 0.5,
            "tenant_id": tenant,
            **kw,
        }
    )


async def run(rt: DockerRuntime, s: RunSpec) -> list[str]:
    report = await rt.wait(await rt.start(s))
    return list(report.output_tail)


def _mask(names: tuple[str, ...]) -> int:
    bits = {
        "CHOWN": 0,
        "DAC_OVERRIDE": 1,
        "FOWNER": 3,
        "FSETID": 4,
        "KILL": 5,
        "SETGID": 6,
        "SETUID": 7,
        "SETPCAP": 8,
        "NET_BIND_SERVICE": 10,
        "NET_RAW": 13,
        "SYS_CHROOT": 18,
        "MKNOD": 27,
        "AUDIT_WRITE": 29,
        "SETFCAP": 31,
    }
    return sum(1 << bits[n] for n in names)


async def test_the_images_user_by_default_with_the_kept_capabilities(
    make: type[DockerRuntime], engine: docker.DockerClient
) -> None:
    rt = make()
    h = await rt.start(
        spec(
            "id -u; mkdir -p /www && echo ok > /www/f && cat /www/f; grep CapEff /proc/self/status"
        )
    )
    uid, written, caps = (await rt.wait(h)).output_tail
    assert (uid, written) == ("0", "ok")  # busybox's user is root: it writes under /
    assert int(caps.split()[1], 16) == _mask(KEPT_CAPABILITIES)
    assert _mask(KEPT_CAPABILITIES) & _mask(("NET_RAW", "MKNOD", "AUDIT_WRITE", "SETFCAP")) == 0
    host = engine.containers.get(h.id).attrs["HostConfig"]
    # Everything else stays: no privileges, no new privileges, limits.
    assert host["CapDrop"] == ["ALL"] and sorted(host["CapAdd"]) == sorted(KEPT_CAPABILITIES)
    assert host["Privileged"] is False and host["SecurityOpt"] == ["no-new-privileges"]
    assert host["PidsLimit"] == 4096 and host["Memory"] == 64 * 1024 * 1024
    assert host["NanoCpus"] == 500_000_000
    assert not host.get("User") and not engine.containers.get(h.id).attrs["Config"]["User"]
    # Raw sockets are among what is dropped: ping (ICMP through a raw socket) is refused.
    assert await run(rt, spec("ping -c 1 -W 1 127.0.0.1 >/dev/null 2>&1 || echo refused")) == [
        "refused"
    ]


async def test_a_forced_user_applies_except_to_the_tenants_allowed_the_images(
    make: type[DockerRuntime], engine: docker.DockerClient
) -> None:
    rt = make(user="65534:65534", root_tenants=frozenset({TENANTS[1]}))
    h = await rt.start(spec("id -u; id -g; grep CapEff /proc/self/status"))
    assert list((await rt.wait(h)).output_tail) == ["65534", "65534", "CapEff:\t0000000000000000"]
    host = engine.containers.get(h.id).attrs["HostConfig"]
    assert host["CapDrop"] == ["ALL"] and not host.get("CapAdd")  # a forced uid keeps none
    assert await run(rt, spec("id -u", tenant=TENANTS[1])) == ["0"]


async def test_user_namespace_remapping_is_what_the_engine_says(
    make: type[DockerRuntime], engine: docker.DockerClient
) -> None:
    options = engine.info().get("SecurityOptions") or []
    remapped = any("name=userns" in o for o in options)
    assert make().node_facts() == {"userns_remap": remapped}


def test_a_remapping_engine_is_reported_and_asked_once() -> None:
    # This engine does not remap (CI): an engine that says so stands in for one that does.
    class Remapping:
        asked = 0

        def info(self) -> dict[str, object]:
            self.asked += 1
            return {"SecurityOptions": ["name=seccomp,profile=builtin", "name=userns"]}

    rt, remapping = DockerRuntime(), Remapping()
    rt._client = remapping
    assert rt.node_facts() == {"userns_remap": True}
    assert rt.userns_remap() is True and remapping.asked == 1


async def test_read_only_root_with_a_tmpfs_tmp(
    make: type[DockerRuntime], engine: docker.DockerClient
) -> None:
    rt = make(read_only_root=True, tmp_size_mb=16)
    s = spec("touch /root-file 2>/dev/null || echo root-read-only; touch /tmp/f && echo tmp-ok")
    h = await rt.start(s)
    assert list((await rt.wait(h)).output_tail) == ["root-read-only", "tmp-ok"]
    host = engine.containers.get(h.id).attrs["HostConfig"]
    assert host["ReadonlyRootfs"] is True and "size=16m" in host["Tmpfs"]["/tmp"]
    # Off (the default), the root filesystem is writable again, as before.
    assert await run(make(user=None), spec("touch /root-file && echo ok")) == ["ok"]


async def test_open_files_limit(make: type[DockerRuntime]) -> None:
    assert await run(make(nofile=1024), spec("ulimit -n")) == ["1024"]
    assert await run(make(), spec("ulimit -n")) == ["16384"]


async def test_each_tenant_has_a_network_no_other_tenant_reaches(
    make: type[DockerRuntime], engine: docker.DockerClient
) -> None:
    rt = make(isolation="iptables")
    server = await rt.start(spec("while true; do echo hello | nc -l -p 8080; done"))
    container = engine.containers.get(server.id)
    networks = container.attrs["NetworkSettings"]["Networks"]
    assert list(networks) == [network_name(TENANTS[0])]
    address = networks[network_name(TENANTS[0])]["IPAddress"]
    net = engine.networks.get(network_name(TENANTS[0]))
    assert net.attrs["Options"]["com.docker.network.bridge.name"] == bridge_name(TENANTS[0])
    probe = f"nc -w 2 {address} 8080 </dev/null 2>/dev/null || echo unreachable"
    try:
        # The same tenant's container reaches it; another tenant's never does.
        assert await run(rt, spec(probe)) == ["hello"]
        assert await run(rt, spec(probe, tenant=TENANTS[1])) == ["unreachable"]
    finally:
        await rt.stop(server, grace_s=1)
    assert bridge_name(TENANTS[1]) in _chain()


def _chain() -> str:
    import subprocess

    return subprocess.run(
        ["iptables", "-S", CHAIN], capture_output=True, text=True, check=True
    ).stdout
