"""Nodes: inventory, liveness and card exclusion as events (stream `node-<id>`).

Heartbeats are not events (they would flood the store); the node monitor turns their absence
into `node_offline`, and a card's absence into `gpu_lost`, once a threshold is crossed.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class NodeStatus(StrEnum):
    ONLINE = "online"
    OFFLINE = "offline"
    GONE = "gone"


class GpuCard(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    index: int
    vendor: str
    model: str
    vram_mb: int = Field(ge=0)
    mig_capable: bool = False
    mig_enabled: bool = False  # MIG mode on: fractions get a hardware instance (gold)


# Host ports the scheduler allocates from on a node that reports no range of its own
# (rendezvous and serving ports, docs/groups.md); below Linux's ephemeral range (32768-).
DEFAULT_PORT_RANGE = (20000, 32000)
LOOPBACK_PREFIXES = ("127.", "::1", "localhost")


def is_loopback(address: str) -> bool:
    """True for an address only its own host can reach (127.0.0.0/8, ::1, localhost)."""
    return not address or address.startswith(LOOPBACK_PREFIXES) or address == "0:0:0:0:0:0:0:1"


class NodeInventory(BaseModel):
    model_config = ConfigDict(frozen=True)

    hostname: str = ""
    # The address other nodes reach this one at (MASTER_ADDR of a rank 0 placed here, the
    # router's target), and the machine it runs on: agents that share a machine report the
    # same `host_id` (its /etc/machine-id), and share its ports.
    address: str = "127.0.0.1"
    host_id: str = ""
    port_range: tuple[int, int] = DEFAULT_PORT_RANGE
    memory_mb: int = Field(ge=0)
    cpu_cores: float = Field(ge=0)
    labels: dict[str, str] = Field(default_factory=dict)
    gpus: tuple[GpuCard, ...] = ()
    runtime: str = ""
    # What keeps tenants' containers from reaching each other (agent/runtimes/networks.py):
    # docker | iptables | none ("" from agents before it was reported, or runtimes with none).
    isolation: str = ""
    userns_remap: bool = False  # docker runtime: dockerd remaps user namespaces
    cgroups: str = ""  # process runtime: v2 | v1 | none (no memory cap)
    # Vendor → why that vendor's cards here report no metrics (its tool absent, failing or
    # unreadable: docs/runtimes.md "Vendor telemetry"); empty when every card can be read.
    telemetry: dict[str, str] = Field(default_factory=dict)


class QuarantinedCard(BaseModel):
    """A card kept out of placement after a device fault (docs/operations.md, quarantine)."""

    model_config = ConfigDict(frozen=True)

    gpu_id: str
    code: str  # "xid:79", "ecc:dbe", ... or "manual"
    evidence: str
    task_id: str = ""  # the task whose failure showed it ("" when an operator did it)
    by: str = "retry_engine"  # retry_engine | operator
    since: datetime


class Node(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    status: NodeStatus
    inventory: NodeInventory
    excluded_gpus: tuple[str, ...] = ()
    quarantined_gpus: tuple[QuarantinedCard, ...] = ()
    version: int
    registered_at: datetime
    updated_at: datetime


class CardWatch(BaseModel):
    """Per-card heartbeat counters for GPU-lost detection (SPEC §3): 3 misses, 2 sightings."""

    model_config = ConfigDict(frozen=True)

    missed: int = 0
    seen: int = 0
