"""Agent settings: declared resources, `--help` listing every setting, retention, lanes."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable

import pytest
from pydantic_settings import BaseSettings

from agent.inventory import Inventory
from agent.retention import Retention
from agent.runtimes.base import KEPT_CAPABILITIES, Handle
from agent.settings import AgentSettings, declared, default_address, node_inventory
from heteroflow.cli import _apply_resource_options, build_parser
from heteroflow.platform import PlatformSettings
from libs.bus.lanes import LanePool
from services.scheduler.service import SchedulerSettings


def env_names(cls: type[BaseSettings]) -> set[str]:
    return {f"HETEROFLOW_{name.upper()}" for name in cls.model_fields}


@pytest.mark.parametrize(
    ("command", "classes"),
    [
        ("agent", [AgentSettings]),
        ("up", [AgentSettings, PlatformSettings, SchedulerSettings]),
    ],
    ids=["agent", "up"],
)
def test_help_lists_every_setting(
    command: str, classes: list[type[BaseSettings]], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    text = capsys.readouterr().out
    for cls in classes:
        for env in env_names(cls):
            assert env in text, env
    assert "HETEROFLOW_NODE_CPU_CORES                 unset" in text


def test_resource_options_become_agent_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("NODE_CPU_CORES", "NODE_MEMORY_MB", "NODE_LABELS", "DECLARED_GPUS"):
        monkeypatch.delenv(f"HETEROFLOW_{var}", raising=False)
    args = build_parser().parse_args(
        ["up", "--cpus", "64", "--memory-mb", "131072", "--labels", '{"zone": "a"}']
    )
    with monkeypatch.context() as m:
        m.setattr(os, "environ", dict(os.environ))
        _apply_resource_options(args)
        s = AgentSettings()
    assert (s.node_cpu_cores, s.node_memory_mb, s.node_labels) == (64, 131072, {"zone": "a"})


def test_declared_resources_override_detection() -> None:
    inv = Inventory(node_id="n", hostname="h", memory_mb=4096, cpu_cores=2)
    assert declared(inv, AgentSettings(node_id="n", host_id="")) == inv
    got = declared(inv, AgentSettings(node_id="n", node_cpu_cores=64, node_memory_mb=131072))
    assert (got.cpu_cores, got.memory_mb) == (64, 131072)


def test_the_agent_reports_its_machine_address_and_port_range() -> None:
    inv = Inventory(node_id="n", hostname="h", memory_mb=4096, cpu_cores=2)
    s = AgentSettings(node_id="n", host_id="m1", port_range="21000-21999")
    got = node_inventory(declared(inv, s), s.address)
    assert (got.host_id, got.port_range) == ("m1", (21000, 21999))
    # By default: the default route's source address (or loopback without a route).
    assert AgentSettings(node_id="n").address == default_address()
    with pytest.raises(ValueError, match="HETEROFLOW_PORT_RANGE"):
        declared(inv, AgentSettings(node_id="n", port_range="30000-20000"))


def test_containers_keep_the_images_user_unless_the_operator_forces_one() -> None:
    opts = AgentSettings(node_id="n").docker_options()
    assert opts["user"] is None and opts["capabilities"] == KEPT_CAPABILITIES
    forced = AgentSettings(
        node_id="n",
        container_user="1000:1000",
        root_tenants=["ops"],
        container_capabilities=["cap_chown", " NET_BIND_SERVICE"],
    ).docker_options()
    assert (forced["user"], forced["root_tenants"]) == ("1000:1000", frozenset({"ops"}))
    assert forced["capabilities"] == ("CHOWN", "NET_BIND_SERVICE")
    with pytest.raises(ValueError, match="container_capabilities: unknown capability FLY"):
        AgentSettings(node_id="n", container_capabilities=["CHOWN", "FLY"])


def test_process_limits_settings_and_what_the_inventory_says() -> None:
    s = AgentSettings(node_id="n", cgroups="v1", cgroup_parent="/hf", process_pids_limit=512)
    assert s.process_options() == {"cgroups": "v1", "cgroup_parent": "/hf", "pids_limit": 512}
    with pytest.raises(ValueError, match="cgroups: 'v3' is not one of auto, v2, v1, none"):
        AgentSettings(node_id="n", cgroups="v3")
    # A misspelt isolation: refused naming the setting, not reported as the node's isolation.
    match = "container_isolation: 'iptable' is not one of auto, docker, iptables, none"
    with pytest.raises(ValueError, match=match):
        AgentSettings(node_id="n", container_isolation="iptable")
    inv = Inventory(
        node_id="n", hostname="h", memory_mb=1, cpu_cores=1, userns_remap=True, cgroups="none"
    )
    got = node_inventory(inv, "10.0.0.1")
    assert (got.userns_remap, got.cgroups) == (True, "none")


def handle(task: str, attempt: int = 0) -> Handle:
    return Handle(runtime="process", id="", task_id=task, attempt=attempt)


async def test_retention_keeps_the_newest_by_count_and_age() -> None:
    now = [0.0]
    removed: list[str] = []

    async def remove(h: Handle) -> None:
        removed.append(f"{h.task_id}/{h.attempt}")

    r = Retention(remove, keep=2, keep_s=10.0, clock=lambda: now[0])
    for i in range(4):
        now[0] = float(i)
        await r.finished(handle(f"t{i}"))
    assert removed == ["t0/0", "t1/0"] and len(r) == 2
    assert r.handle_for("t3") == handle("t3") and r.handle_for("t0") is None
    now[0] = 12.5  # t2 finished at 2, t3 at 3: only t2 is past 10 s
    await r.prune()
    assert removed[-1] == "t2/0" and r.handle_for("t3") is not None
    # A retry of t3 on this node: the newest attempt answers for the task.
    await r.finished(handle("t3", 1))
    assert r.handle_for("t3") == handle("t3", 1)


async def test_retention_disabled_removes_nothing() -> None:
    async def remove(h: Handle) -> None:
        raise AssertionError("removed")

    r = Retention(remove, keep=0, keep_s=0, enabled=False)
    await r.finished(handle("t"))
    assert r.handle_for("t") is not None


async def test_lanes_keep_order_per_key_and_run_keys_concurrently() -> None:
    pool = LanePool(max_in_flight=4)
    log: list[str] = []
    gate = asyncio.Event()

    def job(name: str, wait: bool = False) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            if wait:
                await gate.wait()
            log.append(name)

        return run

    await pool.submit("a", job("a1", wait=True))
    await pool.submit("a", job("a2"))
    await pool.submit("b", job("b1"))
    await asyncio.sleep(0.01)
    assert log == ["b1"]  # a1 blocks its lane only
    assert pool.in_flight == 2
    # Four admitted (a1, a2 and two of c): the next submit waits for a slot.
    await pool.submit("c", job("c1"))
    await pool.submit("c", job("c2", wait=True))
    await pool.submit("c", job("c3"))
    blocked = asyncio.create_task(pool.submit("d", job("d1")))
    await asyncio.sleep(0.01)
    assert not blocked.done()
    gate.set()
    await blocked
    await pool.idle()
    assert log.index("a1") < log.index("a2")
    assert log.index("c1") < log.index("c2") < log.index("c3")
    assert set(log) == {"a1", "a2", "b1", "c1", "c2", "c3", "d1"}
