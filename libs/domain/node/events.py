"""Node events (stream `node-<id>`, and the join in `system`)."""

from __future__ import annotations

from typing import ClassVar

from libs.domain.node.model import NodeInventory
from libs.domain.payload import Payload, ReasonedPayload, register


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


class CardQuarantined(Payload):
    """A device fault (or an operator) took one card out of placement, with the evidence.

    Only that card: the node and its other cards stay placeable (docs/operations.md).
    """

    type: ClassVar[str] = "card_quarantined"
    stream_type: ClassVar[str] = "node"

    node_id: str
    gpu_id: str
    code: str  # "xid:79", "ecc:dbe", "acl:507054", "amdgpu:ras" or "manual"
    evidence: str
    task_id: str = ""
    by: str = "retry_engine"  # retry_engine | operator


class CardRestored(Payload):
    """A quarantined card is placeable again: its health probes passed, or an operator said so."""

    type: ClassVar[str] = "card_restored"
    stream_type: ClassVar[str] = "node"

    node_id: str
    gpu_id: str
    by: str = "probe"  # probe | operator
    probes_passed: int = 0


NODE_EVENTS: tuple[type[Payload], ...] = (
    NodeRegistered,
    NodeOffline,
    GpuLost,
    GpuRecovered,
    CardQuarantined,
    CardRestored,
)
register(*NODE_EVENTS)
