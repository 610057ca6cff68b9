"""Tenants' containers do not reach each other by luck: on this engine (CI runs
`dockerd --iptables=false`) the node's default isolation (`auto`) either keeps a TCP connect
from one tenant's container to another's from answering, or the node says `isolation: none`;
tenant networks are per installation, so two installations on one engine are kept apart too;
the node's inventory says which isolation it has."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator

import docker
import docker.errors
import pytest

from agent.runtimes.base import LABEL_MANAGED, LABEL_TASK_ID, RunSpec, RuntimeFault
from agent.runtimes.docker import DockerRuntime
from agent.runtimes.networks import (
    DOCKER_CHAINS,
    bridge_name,
    detect_isolation,
    network_name,
    node_isolation,
    unisolate,
)

from .cluster import Cluster
from .conftest import requires_docker

pytestmark = [pytest.mark.integration, pytest.mark.docker, requires_docker]

IMAGE = "busybox:latest"
RUN = uuid.uuid4().hex[:8]
TENANTS = (f"a{RUN}", f"b{RUN}")
INSTALLATIONS = (f"i{RUN}", f"j{RUN}")


@pytest.fixture(scope="module")
def engine() -> Iterator[docker.DockerClient]:
    client = docker.from_env()
    yield client
    for c in client.containers.list(all=True, filters={"label": f"{LABEL_MANAGED}=true"}):
        if c.labels.get(LABEL_TASK_ID, "").startswith(f"s{RUN}"):
            c.remove(force=True)
    for inst in INSTALLATIONS:
        for tenant in TENANTS:
            for net in client.networks.list(names=[network_name(tenant, inst)]):
                net.remove()
            with contextlib.suppress(RuntimeFault):
                unisolate(bridge_name(tenant, inst))
    client.close()


@pytest.fixture
async def runtimes(engine: docker.DockerClient) -> AsyncIterator[list[DockerRuntime]]:
    # As the agent's settings make them: isolation `auto`, the installation's id.
    made = [DockerRuntime(wait_poll_s=1.0, isolation="auto", installation=i) for i in INSTALLATIONS]
    yield made
    for rt in made:
        await rt.close()


def spec(command: str, tenant: str) -> RunSpec:
    return RunSpec.model_validate(
        {
            "task_id": f"s{RUN}-{uuid.uuid4().hex[:8]}",
            "attempt": 0,
            "image": IMAGE,
            "command": command,
            "memory_mb": 64,
            "cpu_cores": 0.5,
            "tenant_id": tenant,
        }
    )


async def probe(rt: DockerRuntime, address: str, tenant: str) -> list[str]:
    s = spec(f"nc -w 2 {address} 8080 </dev/null 2>/dev/null || echo unreachable", tenant)
    return list((await rt.wait(await rt.start(s))).output_tail)


def docker_manages_iptables() -> bool:
    return any(
        subprocess.run(["iptables", "-w", "-S", c], capture_output=True, check=False).returncode
        == 0
        for c in DOCKER_CHAINS
    )


def agent_can_isolate(engine: docker.DockerClient) -> bool:
    """What the agent's own rules need, looked at without its code: an iptables that lists
    FORWARD (the binary, the permission) and the engine's default bridge in this network
    namespace."""
    exe = shutil.which("iptables")
    if (
        exe is None
        or subprocess.run([exe, "-w", "-S", "FORWARD"], capture_output=True, check=False).returncode
    ):
        return False
    options = engine.networks.get("bridge").attrs.get("Options") or {}
    bridge = options.get("com.docker.network.bridge.name") or "docker0"
    return os.path.exists(f"/sys/class/net/{bridge}")


async def test_cross_tenant_tcp_is_blocked_or_the_node_says_none(
    runtimes: list[DockerRuntime], engine: docker.DockerClient
) -> None:
    mine, other_installation = runtimes
    said = node_isolation(mine)
    server = await mine.start(spec("while true; do echo hello | nc -l -p 8080; done", TENANTS[0]))
    try:
        networks = engine.containers.get(server.id).attrs["NetworkSettings"]["Networks"]
        assert list(networks) == [network_name(TENANTS[0], INSTALLATIONS[0])]
        address = next(iter(networks.values()))["IPAddress"]
        # The probe works: the same tenant of the same installation is answered.
        assert await probe(mine, address, TENANTS[0]) == ["hello"]
        # The tenant networks are kept apart as the node says (found once, at start-up).
        assert mine._networks is not None and mine._networks.isolation == said
        if said == "none":
            # Nothing keeps them apart here, and the node says so; only where the agent
            # could not have added its own rules.
            assert not agent_can_isolate(engine), "iptables is usable here, yet none"
            return
        if not docker_manages_iptables():
            assert said == "iptables"  # not `docker`: dockerd keeps nothing apart here
        assert await probe(mine, address, TENANTS[1]) == ["unreachable"]
        # Another installation on this engine: the same tenant's name, another network.
        assert network_name(TENANTS[0], INSTALLATIONS[1]) != network_name(
            TENANTS[0], INSTALLATIONS[0]
        )
        assert await probe(other_installation, address, TENANTS[0]) == ["unreachable"]
    finally:
        await mine.stop(server, grace_s=1)


def test_the_nodes_inventory_says_its_isolation(cluster: Cluster) -> None:
    client = docker.from_env()
    try:
        expected, why = detect_isolation(client)
        assert expected != "none" or not agent_can_isolate(client), why
    finally:
        client.close()
    cluster.start_agent("d1", runtime="docker")
    cluster.start_agent("p1", runtime="process")
    cluster.start_agent("d2", runtime="docker", HETEROFLOW_CONTAINER_ISOLATION="none")
    said = {n["id"]: n["inventory"].get("isolation") for n in cluster.nodes()}
    assert said == {"d1": expected, "p1": "none", "d2": "none"}, (said, why)
    if not docker_manages_iptables():
        assert expected != "docker", why
