"""Tenant networks do not outlive their containers: the engine's address pools hold about
30 bridges, so an installation's networks that no container uses are removed when its agent
stops (and by `prune`), while one still in use is kept."""

from __future__ import annotations

import contextlib
import uuid

import docker
import docker.errors
import pytest

from agent.runtimes.base import LABEL_MANAGED, RunSpec
from agent.runtimes.docker import DockerRuntime
from agent.runtimes.networks import network_name, prune

from .conftest import requires_docker

pytestmark = [pytest.mark.integration, pytest.mark.docker, requires_docker]


def _names(client: docker.DockerClient) -> set[str]:
    return {str(n["Name"]) for n in client.api.networks()}


async def test_unused_tenant_networks_are_removed_and_used_ones_kept() -> None:
    run = uuid.uuid4().hex[:8]
    installation, other = f"p{run}", f"q{run}"
    client = docker.from_env()
    runtime = DockerRuntime(wait_poll_s=0.5, isolation="none", installation=installation)
    bystander = DockerRuntime(wait_poll_s=0.5, isolation="none", installation=other)
    busy, idle = f"busy{run}", f"idle{run}"
    try:
        for tenant in (busy, idle):
            spec = RunSpec(
                task_id=f"t-{tenant}",
                attempt=1,
                tenant_id=tenant,
                image="busybox:latest",
                command="sleep 60" if tenant == busy else "true",
            )
            handle = await runtime.start(spec)
            if tenant == idle:
                await runtime.wait(handle)
                await runtime.remove(handle)
        await bystander.start(
            RunSpec(
                task_id=f"t-{other}",
                attempt=1,
                tenant_id=idle,
                image="busybox:latest",
                command="true",
            )
        )
        before = _names(client)
        assert {network_name(busy, installation), network_name(idle, installation)} <= before
        await runtime.close()
        after = _names(client)
        # The idle tenant's network is gone, the busy one's kept, the other installation's
        # untouched (its container has exited but still references it).
        assert network_name(idle, installation) not in after
        assert network_name(busy, installation) in after
        assert network_name(idle, other) in after
        assert prune(client, "") == []  # no installation: nothing is removed
    finally:
        for c in client.api.containers(all=True, filters={"label": f"{LABEL_MANAGED}=true"}):
            if run in str((c.get("Labels") or {}).get("heteroflow.task_id", "")):
                with contextlib.suppress(docker.errors.NotFound):
                    client.api.remove_container(c["Id"], force=True)
        assert network_name(busy, installation) in prune(client, installation)
        assert network_name(idle, other) in prune(client, other)
        await bystander.close()
        client.close()


async def test_concurrent_first_starts_of_a_tenant_share_one_network() -> None:
    """The first starts of a new runtime arrive together (a group's replicas): they make one
    network between them, none fails on a network made meanwhile (with isolation `auto`,
    found at start-up, each once built its own and raced to create it)."""
    import asyncio

    run = uuid.uuid4().hex[:8]
    installation, tenant = f"c{run}", f"t{run}"
    client = docker.from_env()
    runtime = DockerRuntime(wait_poll_s=0.5, isolation="auto", installation=installation)
    try:
        specs = [
            RunSpec(
                task_id=f"c{run}-{i}",
                attempt=1,
                tenant_id=tenant,
                image="busybox:latest",
                command="true",
            )
            for i in range(4)
        ]
        handles = await asyncio.gather(*(runtime.start(s) for s in specs))
        assert len(handles) == 4
        names = [n for n in _names(client) if n == network_name(tenant, installation)]
        assert names == [network_name(tenant, installation)]
    finally:
        for c in client.api.containers(all=True, filters={"label": f"{LABEL_MANAGED}=true"}):
            if str((c.get("Labels") or {}).get("heteroflow.task_id", "")).startswith(f"c{run}"):
                with contextlib.suppress(docker.errors.NotFound):
                    client.api.remove_container(c["Id"], force=True)
        await runtime.close()
        assert network_name(tenant, installation) not in _names(client)
        client.close()


async def test_a_network_another_agent_pruned_is_made_again() -> None:
    """Two agents of one installation share an engine (as two agents on one machine do):
    one stops and removes the tenant's idle network; the other's next start for that tenant
    makes it again instead of failing on the network it had made before."""
    run = uuid.uuid4().hex[:8]
    installation, tenant = f"r{run}", f"t{run}"
    client = docker.from_env()
    stopping = DockerRuntime(wait_poll_s=0.5, isolation="none", installation=installation)
    staying = DockerRuntime(wait_poll_s=0.5, isolation="none", installation=installation)

    def spec(i: int) -> RunSpec:
        return RunSpec(task_id=f"r{run}-{i}", attempt=1, tenant_id=tenant, image="busybox:latest")

    try:
        for i, rt in enumerate((staying, stopping)):
            handle = await rt.start(spec(i))
            await rt.wait(handle)
            await rt.remove(handle)
        await stopping.close()
        assert network_name(tenant, installation) not in _names(client)
        handle = await staying.start(spec(2))
        assert (await staying.wait(handle)).exit_code == 0
        assert network_name(tenant, installation) in _names(client)
    finally:
        for c in client.api.containers(all=True, filters={"label": f"{LABEL_MANAGED}=true"}):
            if str((c.get("Labels") or {}).get("heteroflow.task_id", "")).startswith(f"r{run}"):
                with contextlib.suppress(docker.errors.NotFound):
                    client.api.remove_container(c["Id"], force=True)
        await staying.close()
        assert network_name(tenant, installation) not in _names(client)
        client.close()
