"""An operator's hand on card quarantine (docs/operations.md, device faults).

`POST /nodes/{node}/gpus/{gpu}/uncordon` returns a quarantined card to placement at once,
without waiting for its health probes; `POST /nodes/{node}/gpus/{gpu}/quarantine` takes a
card out of placement by hand, with the operator's reason as its evidence. Both append one
node event (`card_restored` by operator, `card_quarantined` with code `manual`) and answer
the node as `GET /nodes/{node}` shows it. Tasks already running on the card are not touched.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from libs.domain.errors import Code, DomainError, NotFound
from libs.domain.node.events import CardQuarantined, CardRestored
from libs.domain.node.model import Node
from libs.domain.payload import Payload
from libs.store.projections import NODES

from .deps import Principal, Store, require_operator
from .schemas import body_of

router = APIRouter(prefix="/api/v1", tags=["operations"])


class QuarantineBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="", max_length=500, description="why, shown as the evidence")


Body = Annotated[QuarantineBody, Depends(body_of(QuarantineBody))]


def _card(node: Node | None, node_id: str, gpu_id: str) -> Node:
    if node is None:
        raise NotFound("node")
    if gpu_id not in {g.id for g in node.inventory.gpus}:
        raise DomainError(Code.NOT_FOUND, f"node {node_id!r} has no card {gpu_id!r}", ["gpu_id"])
    return node


@router.post("/nodes/{node_id}/gpus/{gpu_id}/uncordon")
async def uncordon_card(
    node_id: str, gpu_id: str, principal: Principal, store: Store
) -> dict[str, Any]:
    """Return a quarantined card to placement now (its probes are not waited for)."""
    require_operator(principal)

    def decide(node: Node | None) -> list[Payload]:
        found = _card(node, node_id, gpu_id)
        if gpu_id not in {q.gpu_id for q in found.quarantined_gpus}:
            raise DomainError(
                Code.INVALID_STATUS_FOR_OPERATION,
                f"card {gpu_id!r} of node {node_id!r} is not quarantined",
                ["gpu_id"],
            )
        return [CardRestored(node_id=node_id, gpu_id=gpu_id, by="operator")]

    node = await store.execute_aggregate(NODES, node_id, decide, metadata={"actor": "operator"})
    assert node is not None
    return node.model_dump(mode="json")


@router.post("/nodes/{node_id}/gpus/{gpu_id}/quarantine")
async def quarantine_card(
    node_id: str,
    gpu_id: str,
    principal: Principal,
    store: Store,
    body: Body,
) -> dict[str, Any]:
    """Take one card out of placement by hand; it returns after its health probes pass, or
    with `uncordon`. A card already quarantined keeps its first evidence."""
    require_operator(principal)
    reason = body.reason or "quarantined by an operator"

    def decide(node: Node | None) -> list[Payload]:
        found = _card(node, node_id, gpu_id)
        if gpu_id in {q.gpu_id for q in found.quarantined_gpus}:
            return []
        return [
            CardQuarantined(
                node_id=node_id, gpu_id=gpu_id, code="manual", evidence=reason, by="operator"
            )
        ]

    node = await store.execute_aggregate(NODES, node_id, decide, metadata={"actor": "operator"})
    assert node is not None
    return node.model_dump(mode="json")
