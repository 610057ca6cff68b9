"""One Docker network per tenant, and what keeps tenants' networks apart.

Each tenant's containers join `hf-<installation>-tenant-<tenant>`, a bridge of its own
(`hft-<hash of both>`), so containers of one tenant reach each other and never another
tenant's, nor those of another installation sharing the engine. Docker keeps user-defined
bridges apart with its own iptables rules, which exist only while dockerd manages iptables
(`isolation="docker"`). An engine run with `--iptables=false` routes between bridges freely;
there `isolation="iptables"` has the agent add the rules itself, in a chain of its own
(`HF-TENANTS`, jumped to first from FORWARD): traffic that stays on one tenant bridge passes,
traffic between it and any other bridge (another tenant's, `docker0`, `br-*`) is dropped.

`isolation="auto"` (the default) decides at start-up (`detect_isolation`): `docker` when
dockerd's own chains are in this network namespace, else `iptables` when the agent can add
its rules there (an `iptables` binary, the permission, and the engine's bridges in its own
namespace), else `none`: the networks are made but nothing keeps them apart, and the node
says so in its inventory (`isolation: none`).

Blocking calls (the docker SDK, iptables): the runtime calls these from its thread pool.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading

import docker
import docker.errors
import structlog
from docker.models.networks import Network

from .base import ISOLATIONS, LABEL_INSTALLATION, LABEL_MANAGED, RuntimeFault

log = structlog.get_logger(__name__)

CHAIN = "HF-TENANTS"
BRIDGE_PREFIX = "hft-"
LABEL_TENANT = "heteroflow.tenant"
# Chains dockerd creates in the filter table while it manages iptables (before and since
# Docker 28's rework of its forwarding rules).
DOCKER_CHAINS = ("DOCKER-ISOLATION-STAGE-1", "DOCKER-FORWARD")
# Bridges a tenant bridge must not exchange traffic with: every other tenant's, Docker's
# default bridge and other user-defined ones.
_FOREIGN = (f"{BRIDGE_PREFIX}+", "docker0", "br-+")


def network_name(tenant_id: str, installation: str = "") -> str:
    """`hf-<installation>-tenant-<tenant>` (`hf-tenant-<tenant>` with no installation)."""
    scope = f"{installation}-" if installation else ""
    return f"hf-{scope}tenant-{tenant_id or 'none'}"


def bridge_name(tenant_id: str, installation: str = "") -> str:
    """A Linux interface name (≤ 15 characters) that is the same on every agent of one
    installation."""
    key = f"{installation}/{tenant_id}" if installation else tenant_id
    return BRIDGE_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:11]


def _default_bridge(client: docker.DockerClient) -> str | None:
    """The interface of the engine's default `bridge` network, None when it has none."""
    try:
        found = client.networks.list(names=["bridge"])
    except docker.errors.DockerException:
        return None
    for net in found:
        if net.name == "bridge":
            options = net.attrs.get("Options") or {}
            return str(options.get("com.docker.network.bridge.name") or "docker0")
    return None


def detect_isolation(
    client: docker.DockerClient, configured: str = "auto", *, sys_net: str = "/sys/class/net"
) -> tuple[str, str]:
    """(the isolation tenant networks get, why). `configured` other than `auto` is taken as
    the operator says; `auto` looks at this node (module docstring). Blocking."""
    if configured != "auto":
        return configured, "configured"
    if shutil.which("iptables") is None:
        return "none", "no iptables binary on this node"
    if not _iptables("-S", "FORWARD"):
        return "none", "iptables refused to list FORWARD (no permission)"
    bridge = _default_bridge(client)
    if bridge is not None and not os.path.exists(os.path.join(sys_net, bridge)):
        return "none", (
            f"the engine's bridge {bridge} is not in this network namespace (an agent in a "
            "container of its own): its rules can be neither seen nor added"
        )
    if any(_iptables("-S", chain) for chain in DOCKER_CHAINS):
        return "docker", "dockerd manages iptables"
    if _chain_jumped():
        return "iptables", "dockerd does not manage iptables: the agent's own rules"
    return "none", "iptables refused the agent's chain or its FORWARD jump"


def node_isolation(runtime: object) -> str:
    """What keeps tenants' work apart on this node, for its inventory: `docker`, `iptables`
    or `none` for the docker runtime; `none` for the process runtime (tasks share the host's
    network); "" for a runtime that runs nothing. The docker runtime keeps what was found
    (`auto` is looked at once, here): its tenant networks are kept apart as the inventory
    says. Blocking."""
    name = getattr(runtime, "name", "")
    if name == "process":
        return "none"
    if name != "docker":
        return ""
    if not getattr(runtime, "tenant_networks", True):
        return "none"
    try:
        client = runtime.client  # type: ignore[attr-defined]
        isolation, why = detect_isolation(client, str(getattr(runtime, "isolation", "auto")))
    except (RuntimeFault, docker.errors.DockerException, OSError) as exc:
        # No engine to look at yet: nothing is known to keep tenants apart.
        isolation, why = "none", f"the engine did not answer: {exc}"
    else:
        runtime.isolation = isolation  # type: ignore[attr-defined]
    log_at = log.warning if isolation == "none" else log.info
    log_at("tenant_isolation", isolation=isolation, why=why)
    return isolation


class TenantNetworks:
    def __init__(
        self, client: docker.DockerClient, isolation: str = "auto", installation: str = ""
    ) -> None:
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}")
        self.client = client
        self.installation = installation
        if isolation == "auto":
            isolation, why = detect_isolation(client)
            log.info("tenant_isolation", isolation=isolation, why=why)
        self.isolation = isolation
        self._ready: set[str] = set()
        self._lock = threading.Lock()

    def ensure(self, tenant_id: str) -> str:
        """The tenant's network name, created (and isolated) on first use."""
        name = network_name(tenant_id, self.installation)
        if name in self._ready:
            return name
        with self._lock:
            if name not in self._ready:
                self._create(tenant_id, name)
                if self.isolation == "iptables":
                    isolate(bridge_name(tenant_id, self.installation))
                self._ready.add(name)
        return name

    def forget_if_gone(self, tenant_id: str) -> bool:
        """True when the tenant's network, made before, no longer exists (another agent of
        this installation sharing the engine removed it while no container used it, `prune`):
        the next `ensure` makes it again."""
        name = network_name(tenant_id, self.installation)
        with self._lock:
            if name not in self._ready:
                return False
            if any(n.name == name for n in self.client.networks.list(names=[name])):
                return False
            self._ready.discard(name)
        log.info("tenant_network_gone", network=name)
        return True

    def _installed(self) -> dict[str, str]:
        return {LABEL_INSTALLATION: self.installation} if self.installation else {}

    def _create(self, tenant_id: str, name: str) -> Network:
        found = self.client.networks.list(names=[name])
        if found:
            return found[0]
        try:
            return self.client.networks.create(
                name,
                driver="bridge",
                labels={LABEL_MANAGED: "true", LABEL_TENANT: tenant_id, **self._installed()},
                options={
                    "com.docker.network.bridge.name": bridge_name(tenant_id, self.installation)
                },
            )
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # another agent on this engine made it first
                return self.client.networks.get(name)
            # Made by another agent meanwhile, refused as a bridge name already taken.
            for net in self.client.networks.list(names=[name]):
                if net.name == name:
                    return net
            raise RuntimeFault(f"cannot create network {name}: {exc}") from exc


def prune(client: docker.DockerClient, installation: str, isolation: str = "") -> list[str]:
    """Remove this installation's tenant networks that no container uses any more (and,
    with `isolation="iptables"`, their rules); returns the names removed. A network still in
    use, or removed meanwhile by another agent sharing the engine, is left alone. Without an
    installation nothing is removed (the networks of unnamed installations are shared).
    Blocking."""
    if not installation:
        return []
    labels = [f"{LABEL_MANAGED}=true", f"{LABEL_INSTALLATION}={installation}"]
    removed: list[str] = []
    for net in client.api.networks(filters={"label": labels}):
        name = str(net.get("Name") or "")
        try:
            detail = client.api.inspect_network(net["Id"])
            if detail.get("Containers"):
                continue
            client.api.remove_network(net["Id"])
        except docker.errors.APIError as exc:
            if exc.status_code not in (403, 404, 409):  # in use, gone: nothing to do
                log.warning("tenant_network_not_removed", network=name, error=str(exc))
            continue
        removed.append(name)
        tenant = str((net.get("Labels") or {}).get(LABEL_TENANT) or "")
        if isolation == "iptables" and shutil.which("iptables"):
            unisolate(bridge_name(tenant, installation))
    if removed:
        log.info("tenant_networks_removed", networks=removed)
    return removed


def _iptables(*args: str) -> bool:
    """`iptables -w <args>` (waiting for the xtables lock); True when it succeeded."""
    exe = shutil.which("iptables")
    if exe is None:
        raise RuntimeFault("container_isolation=iptables but no iptables binary on this node")
    try:
        done = subprocess.run(
            [exe, "-w", *args], capture_output=True, text=True, check=False, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _chain_jumped() -> bool:
    """The agent's chain exists and FORWARD jumps to it first (idempotent; the jump cannot
    exist without the chain)."""
    _iptables("-N", CHAIN)  # fails harmlessly when it exists
    return _iptables("-C", "FORWARD", "-j", CHAIN) or _iptables("-I", "FORWARD", "1", "-j", CHAIN)


def bridge_rules(bridge: str) -> list[tuple[str, ...]]:
    """The rules that keep `bridge`'s traffic on it. Each names `bridge`, so a bridge never
    isolated (a node in `docker` mode sharing the host) is untouched; its own traffic
    returns first, so the order of blocks in the chain does not matter."""
    return [
        ("-i", bridge, "-o", bridge, "-j", "RETURN"),
        *(("-i", bridge, "-o", other, "-j", "DROP") for other in _FOREIGN),
        *(("-i", other, "-o", bridge, "-j", "DROP") for other in _FOREIGN),
    ]


def isolate(bridge: str) -> None:
    """Keep `bridge`'s traffic on `bridge` (idempotent)."""
    if not _chain_jumped():
        raise RuntimeFault("iptables refused the FORWARD jump")
    for rule in bridge_rules(bridge):
        if not _iptables("-C", CHAIN, *rule) and not _iptables("-A", CHAIN, *rule):
            raise RuntimeFault(f"iptables refused {' '.join(rule)}")
    log.info("tenant_bridge_isolated", bridge=bridge)


def unisolate(bridge: str) -> None:
    """Remove `bridge`'s rules (for a network removed for good)."""
    for rule in bridge_rules(bridge):
        while _iptables("-D", CHAIN, *rule):
            pass
