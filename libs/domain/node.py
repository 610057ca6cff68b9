"""Nodes: inventory, liveness and card exclusion as events (stream `node-<id>`).

Heartbeats are not events (they would flood the store); the node monitor turns their absence
into `node_offline`, and a card's absence into `gpu_lost`, once a threshold is crossed.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from .events import Payload, ReasonedPayload, register


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


class NodeRegistered(Payload):
    """First registration or a re-registration after a restart (inventory may change)."""

    type: ClassVar[str] = "node_registered"
    stream_type: ClassVar[str] = "node"

    node_id: str
    inventory: NodeInventory


class NodeOffline(ReasonedPayload):
    """Heartbeats stopped past the threshold (or, with gone, for good).

    `reason_code` is `node_lost` (offline) or `node_gone` (gone for good).
    """

    type: ClassVar[str] = "node_offline"
    stream_type: ClassVar[str] = "node"

    node_id: str
    silent_seconds: float
    gone: bool = False


class GpuLost(Payload):
    """A card was missing from 3 consecutive heartbeats: excluded from placement."""

    type: ClassVar[str] = "gpu_lost"
    stream_type: ClassVar[str] = "node"

    node_id: str
    gpu_id: str
    missed_heartbeats: int


class GpuRecovered(Payload):
    """A lost card was seen in 2 consecutive heartbeats: placeable again."""

    type: ClassVar[str] = "gpu_recovered"
    stream_type: ClassVar[str] = "node"

    node_id: str
    gpu_id: str
    seen_heartbeats: int


NODE_EVENTS: tuple[type[Payload], ...] = (NodeRegistered, NodeOffline, GpuLost, GpuRecovered)
register(*NODE_EVENTS)


class Node(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    status: NodeStatus
    inventory: NodeInventory
    excluded_gpus: tuple[str, ...] = ()
    version: int
    registered_at: datetime
    updated_at: datetime


def evolve_node(node: Node | None, event: Payload, at: datetime, version: int) -> Node:
    if isinstance(event, NodeRegistered):
        if node is None:
            return Node(
                id=event.node_id,
                status=NodeStatus.ONLINE,
                inventory=event.inventory,
                version=version,
                registered_at=at,
                updated_at=at,
            )
        known = {g.id for g in event.inventory.gpus}
        return node.model_copy(
            update={
                "status": NodeStatus.ONLINE,
                "inventory": event.inventory,
                "version": version,
                "updated_at": at,
                "excluded_gpus": tuple(g for g in node.excluded_gpus if g in known),
            }
        )
    if node is None:
        raise ValueError(f"{event.type} before node_registered")
    update: dict[str, object] = {"version": version, "updated_at": at}
    if isinstance(event, NodeOffline):
        update["status"] = NodeStatus.GONE if event.gone else NodeStatus.OFFLINE
    elif isinstance(event, GpuLost):
        update["excluded_gpus"] = tuple(sorted({*node.excluded_gpus, event.gpu_id}))
    elif isinstance(event, GpuRecovered):
        update["excluded_gpus"] = tuple(g for g in node.excluded_gpus if g != event.gpu_id)
    else:
        raise ValueError(f"not a node event: {event.type}")
    return node.model_copy(update=update)


class CardWatch(BaseModel):
    """Per-card heartbeat counters for GPU-lost detection (SPEC §3): 3 misses, 2 sightings."""

    model_config = ConfigDict(frozen=True)

    missed: int = 0
    seen: int = 0


LOST_AFTER_MISSES = 3
RECOVERED_AFTER_SIGHTINGS = 2


def watch_card(watch: CardWatch, visible: bool, excluded: bool) -> tuple[CardWatch, str | None]:
    """Advance one card's counters by one heartbeat; return 'lost'/'recovered' on a crossing."""
    if visible:
        nxt = CardWatch(missed=0, seen=watch.seen + 1)
        if excluded and nxt.seen >= RECOVERED_AFTER_SIGHTINGS:
            return CardWatch(), "recovered"
        return nxt, None
    nxt = CardWatch(missed=watch.missed + 1, seen=0)
    if not excluded and nxt.missed >= LOST_AFTER_MISSES:
        return nxt, "lost"
    return nxt, None
