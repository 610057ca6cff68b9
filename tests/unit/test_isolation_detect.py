"""How a node decides what keeps tenants' networks apart (agent/runtimes/networks.py
`detect_isolation`), with a stand-in `iptables` on PATH and a stand-in engine; the names of
tenant networks per installation."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from agent.runtimes.base import RuntimeFault
from agent.runtimes.networks import (
    CHAIN,
    TenantNetworks,
    bridge_name,
    detect_isolation,
    network_name,
    node_isolation,
)
from heteroflow.cli_user import events

FAKE = """#!/bin/sh
# Stand-in iptables: MODE says what this node's iptables allows; every call is logged.
echo "$@" >> "{log}"
shift  # -w
case "{mode}" in
  denied) exit 1 ;;
  docker) case "$*" in "-S DOCKER-ISOLATION-STAGE-1"|"-S FORWARD") exit 0 ;; esac; exit 1 ;;
  docker28) case "$*" in "-S DOCKER-FORWARD"|"-S FORWARD") exit 0 ;; esac; exit 1 ;;
  plain) case "$*" in "-S FORWARD"|"-N {chain}"|"-I FORWARD 1 -j {chain}") exit 0 ;; esac; exit 1 ;;
  nojump) case "$*" in "-S FORWARD"|"-N {chain}") exit 0 ;; esac; exit 1 ;;
esac
exit 1
"""


class Net:
    def __init__(self, name: str, bridge: str | None) -> None:
        self.name = name
        self.attrs: dict[str, Any] = {
            "Options": {"com.docker.network.bridge.name": bridge} if bridge else {}
        }


class Networks:
    def __init__(self, nets: list[Net]) -> None:
        self.nets = nets

    def list(self, names: list[str]) -> list[Net]:
        return [n for n in self.nets if n.name in names]


class Client:
    def __init__(self, *nets: Net) -> None:
        self.networks = Networks(list(nets))


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """install(mode): an `iptables` of that mode first on PATH; returns the sys/class/net
    stand-in (with `docker0` in it) and the call log."""
    bin_dir, sys_net = tmp_path / "bin", tmp_path / "net"
    bin_dir.mkdir()
    (sys_net / "docker0").mkdir(parents=True)
    log = tmp_path / "calls"
    log.write_text("")

    def install(mode: str | None) -> tuple[str, Path]:
        if mode is not None:
            exe = bin_dir / "iptables"
            exe.write_text(FAKE.format(log=log, mode=mode, chain=CHAIN))
            exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
        monkeypatch.setenv("PATH", str(bin_dir))
        return str(sys_net), log

    return install


ENGINE = Client(Net("bridge", "docker0"))


def test_dockerd_managing_iptables_is_docker(node: Any) -> None:
    sys_net, _ = node("docker")
    assert detect_isolation(ENGINE, sys_net=sys_net)[0] == "docker"
    sys_net, _ = node("docker28")
    assert detect_isolation(ENGINE, sys_net=sys_net)[0] == "docker"


def test_an_engine_without_iptables_management_gets_the_agents_own_rules(node: Any) -> None:
    sys_net, log = node("plain")
    isolation, why = detect_isolation(ENGINE, sys_net=sys_net)
    assert isolation == "iptables", why
    assert f"-w -I FORWARD 1 -j {CHAIN}" in log.read_text().splitlines()


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        (None, "no iptables binary"),
        ("denied", "no permission"),
        ("nojump", "FORWARD jump"),
    ],
)
def test_where_the_agent_cannot_isolate_it_says_none(node: Any, mode: str, why: str) -> None:
    sys_net, _ = node(mode)
    isolation, said = detect_isolation(ENGINE, sys_net=sys_net)
    assert isolation == "none" and why in said


def test_an_agent_outside_the_engines_network_namespace_says_none(
    node: Any, tmp_path: Path
) -> None:
    _, log = node("plain")
    isolation, why = detect_isolation(ENGINE, sys_net=str(tmp_path / "elsewhere"))
    assert isolation == "none" and "docker0 is not in this network namespace" in why
    assert "-N" not in log.read_text()  # nothing added where it would keep nothing apart


def test_a_configured_isolation_is_taken_as_said(node: Any) -> None:
    sys_net, log = node("denied")
    for mode in ("docker", "iptables", "none"):
        assert detect_isolation(ENGINE, mode, sys_net=sys_net)[0] == mode
    assert log.read_text() == ""


class FakeDocker:
    name = "docker"
    tenant_networks = True

    def __init__(self, isolation: str, client: Any = None) -> None:
        self.isolation, self._client = isolation, client

    @property
    def client(self) -> Any:
        if self._client is None:
            raise RuntimeFault("docker engine unavailable")
        return self._client


def test_the_docker_runtime_keeps_what_its_inventory_says(node: Any) -> None:
    # Found once at start-up: the runtime's tenant networks then use the found isolation
    # instead of looking again at the first start (an engine with no default bridge: the
    # namespace check does not apply).
    _, log = node("plain")
    rt = FakeDocker("auto", Client())
    assert node_isolation(rt) == "iptables"
    assert rt.isolation == "iptables"
    calls = log.read_text()
    assert TenantNetworks(Client(), rt.isolation).isolation == "iptables"
    assert log.read_text() == calls  # nothing looked at again
    down = FakeDocker("auto")
    assert node_isolation(down) == "none"
    assert down.isolation == "auto"  # not known: the first start looks for itself


def test_what_the_inventory_says_for_each_runtime() -> None:
    class Runtime:
        def __init__(self, name: str, **kw: Any) -> None:
            self.name = name
            self.__dict__.update(kw)

    assert node_isolation(Runtime("process")) == "none"
    assert node_isolation(Runtime("simulated")) == ""
    assert node_isolation(Runtime("docker", tenant_networks=False)) == "none"
    engine = Client(Net("bridge", "docker0"))
    assert node_isolation(Runtime("docker", client=engine, isolation="iptables")) == "iptables"

    class Down(Runtime):
        @property
        def client(self) -> Any:
            raise RuntimeFault("docker engine unavailable")

    assert node_isolation(Down("docker", isolation="auto")) == "none"


def test_tenant_networks_carry_the_installation() -> None:
    assert network_name("acme", "i1") == "hf-i1-tenant-acme"
    assert network_name("acme", "i1") != network_name("acme", "i2")
    assert bridge_name("acme", "i1") != bridge_name("acme", "i2")
    assert len(bridge_name("acme", "0123456789abcdef")) <= 15  # a Linux interface name
    assert network_name("acme") == "hf-tenant-acme"  # a runtime given no installation


def test_heteroflow_nodes_shows_a_docker_node_without_isolation() -> None:
    def row(**inventory: object) -> str:
        node = {"id": "n1", "status": "online", "inventory": {"memory_mb": 1024} | inventory}
        return events.nodes_table([node]).splitlines()[1]

    assert "docker+no-isolation " in row(runtime="docker", isolation="none")
    assert "docker+no-isolation+userns" in row(
        runtime="docker", isolation="none", userns_remap=True
    )
    assert "no-isolation" not in row(runtime="docker", isolation="iptables")
    assert "no-isolation" not in row(runtime="process", isolation="none", cgroups="v2")
