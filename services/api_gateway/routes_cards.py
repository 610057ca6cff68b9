"""An operator's hand on card quarantine (docs/operations.md, device faults), and the
node's timeline where quarantines show (`GET /nodes/{node}/events`).

`POST /nodes/{node}/gpus/{gpu}/uncordon` returns a quarantined card to placement at once,
without waiting for its health probes; `POST /nodes/{node}/gpus/{gpu}/quarantine` takes a
card out of placement by hand, with the operator's reason as its evidence. Both append one
node event (`card_restored` by operator, `card_quarantined` with code `manual`) and answer
the node as `GET /nodes/{node}` shows it. Tasks already running on the card are not touched.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from libs.domain.errors import Code, DomainError, NotFound
from libs.domain.node.events import CardQuarantined, CardRestored
from libs.domain.node.model import Node
from libs.domain.payload import Payload
from libs.store import nodes as node_rows
from libs.store.projections import NODES

from . import timeline
from .deps import Principal, Store, require_operator
from .schemas import TimelineQuery, body_of, query_of

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


@router.get("/nodes/{node_id}/events", dependencies=[Depends(query_of(TimelineQuery))])
async def node_events(
    request: Request, node_id: str, principal: Principal, store: Store
) -> dict[str, Any]:
    """The node's timeline (offline, cards lost and recovered, quarantined and restored),
    newest first (operators)."""
    require_operator(principal)
    if await node_rows.get(store, node_id) is None:
        raise NotFound("node")
    page, per_page = timeline.page_params(request)
    return {"node_id": node_id} | await timeline.node_timeline(store, node_id, page, per_page)
