"""One Docker network per tenant, and what keeps tenants' networks apart.

Each tenant's containers join `hf-tenant-<tenant>`, a bridge of its own (`hft-<hash>`), so
containers of one tenant reach each other and never another tenant's. Docker keeps
user-defined bridges apart with its own iptables rules, which exist only while dockerd
manages iptables (`isolation="docker"`). An engine run with `--iptables=false` routes between
bridges freely; there `isolation="iptables"` has the agent add the rules itself, in a chain
of its own (`HF-TENANTS`, jumped to first from FORWARD): traffic that stays on one tenant
bridge passes, traffic between it and any other bridge (another tenant's, `docker0`,
`br-*`) is dropped.

Blocking calls (the docker SDK, iptables): the runtime calls these from its thread pool.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import threading

import docker
import docker.errors
import structlog
from docker.models.networks import Network

from .base import LABEL_MANAGED, RuntimeFault

log = structlog.get_logger(__name__)

CHAIN = "HF-TENANTS"
BRIDGE_PREFIX = "hft-"
LABEL_TENANT = "heteroflow.tenant"
ISOLATIONS = ("docker", "iptables", "none")
# Bridges a tenant bridge must not exchange traffic with: every other tenant's, Docker's
# default bridge and other user-defined ones.
_FOREIGN = (f"{BRIDGE_PREFIX}+", "docker0", "br-+")


def network_name(tenant_id: str) -> str:
    return f"hf-tenant-{tenant_id or 'none'}"


def bridge_name(tenant_id: str) -> str:
    """A Linux interface name (≤ 15 characters) that is the same on every agent."""
    return BRIDGE_PREFIX + hashlib.sha256(tenant_id.encode()).hexdigest()[:11]


class TenantNetworks:
    def __init__(self, client: docker.DockerClient, isolation: str = "docker") -> None:
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}")
        self.client = client
        self.isolation = isolation
        self._ready: set[str] = set()
        self._lock = threading.Lock()

    def ensure(self, tenant_id: str) -> str:
        """The tenant's network name, created (and isolated) on first use."""
        name = network_name(tenant_id)
        if name in self._ready:
            return name
        with self._lock:
            if name not in self._ready:
                self._create(tenant_id, name)
                if self.isolation == "iptables":
                    isolate(bridge_name(tenant_id))
                self._ready.add(name)
        return name

    def _create(self, tenant_id: str, name: str) -> Network:
        found = self.client.networks.list(names=[name])
        if found:
            return found[0]
        try:
            return self.client.networks.create(
                name,
                driver="bridge",
                labels={LABEL_MANAGED: "true", LABEL_TENANT: tenant_id},
                options={"com.docker.network.bridge.name": bridge_name(tenant_id)},
            )
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # another agent on this engine made it first
                return self.client.networks.get(name)
            raise RuntimeFault(f"cannot create network {name}: {exc}") from exc


def _iptables(*args: str) -> bool:
    exe = shutil.which("iptables")
    if exe is None:
        raise RuntimeFault("container_isolation=iptables but no iptables binary on this node")
    done = subprocess.run([exe, "-w", *args], capture_output=True, text=True, check=False)
    return done.returncode == 0


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
    _iptables("-N", CHAIN)  # fails harmlessly when it exists
    if not _iptables("-C", "FORWARD", "-j", CHAIN) and not _iptables(
        "-I", "FORWARD", "1", "-j", CHAIN
    ):
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
