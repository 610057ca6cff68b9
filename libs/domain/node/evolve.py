"""The node fold."""

from __future__ import annotations

from datetime import datetime

from libs.domain.node.events import (
    CardQuarantined,
    CardRestored,
    GpuLost,
    GpuRecovered,
    NodeOffline,
    NodeRegistered,
)
from libs.domain.node.model import Node, NodeStatus, QuarantinedCard
from libs.domain.payload import Payload


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
                # A restart does not cure a card: its quarantine stays until probes pass.
                "quarantined_gpus": tuple(q for q in node.quarantined_gpus if q.gpu_id in known),
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
    elif isinstance(event, CardQuarantined):
        kept = tuple(q for q in node.quarantined_gpus if q.gpu_id != event.gpu_id)
        card = QuarantinedCard(
            gpu_id=event.gpu_id,
            code=event.code,
            evidence=event.evidence,
            task_id=event.task_id,
            by=event.by,
            since=at,
        )
        update["quarantined_gpus"] = tuple(sorted((*kept, card), key=lambda q: q.gpu_id))
    elif isinstance(event, CardRestored):
        update["quarantined_gpus"] = tuple(
            q for q in node.quarantined_gpus if q.gpu_id != event.gpu_id
        )
    else:
        raise ValueError(f"not a node event: {event.type}")
    return node.model_copy(update=update)
