"""Reads of the `nodes` projection: the fleet for the scheduler and the monitor, one node
for the gateway and the retry engine.

Rows are written only by the append path (`eventstore` + `projections`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from libs.domain.node.model import Node, NodeStatus

from .eventstore import EventStore
from .pool import rows


def _nodes(found: list[dict[str, Any]]) -> list[Node]:
    return [Node.model_validate(r["doc"]) for r in found]


async def get(store: EventStore, node_id: str) -> Node | None:
    found = await rows(store, "SELECT doc FROM nodes WHERE id = %s", [node_id])
    return Node.model_validate(found[0]["doc"]) if found else None


async def all_nodes(store: EventStore) -> list[Node]:
    """Every node, by id."""
    return _nodes(await rows(store, "SELECT doc FROM nodes ORDER BY id"))


async def by_ids(store: EventStore, ids: Sequence[str]) -> list[Node]:
    """The named nodes that exist, by id."""
    return _nodes(
        await rows(store, "SELECT doc FROM nodes WHERE id = ANY(%s) ORDER BY id", [list(ids)])
    )


async def each_by_ids(store: EventStore, ids: Sequence[str]) -> Iterator[Node]:
    """The named nodes, parsed one at a time as the caller iterates.

    For the scheduler's view of a large fleet: it keeps a small summary of each node, so
    holding every parsed document at once (about 10 KB each) would only raise the peak."""
    found = await rows(store, "SELECT doc FROM nodes WHERE id = ANY(%s) ORDER BY id", [list(ids)])
    return (Node.model_validate(r["doc"]) for r in found)


async def versions(store: EventStore) -> dict[str, int]:
    """id → version of every node (callers re-read only the nodes that moved)."""
    return {r["id"]: r["version"] for r in await rows(store, "SELECT id, version FROM nodes")}


# The largest card of a node document, in MB (0 for a node without cards).
_MAX_VRAM = (
    "(SELECT coalesce(max((g->>'vram_mb')::int), 0)"
    " FROM jsonb_array_elements(doc->'inventory'->'gpus') g)"
)


async def with_best_alternative(store: EventStore, node_id: str) -> list[Node]:
    """A failed task's node and, of the other online nodes, the one with the largest card.

    That pair answers every question a retry decision asks of the fleet (is the node
    still there, is another node online, does any online node have a bigger card), so the
    retry engine reads at most two documents per failure, not the whole fleet."""
    found = await rows(
        store,
        "(SELECT doc FROM nodes WHERE id = %s)"
        f" UNION ALL (SELECT doc FROM nodes WHERE status = %s AND id <> %s"
        f" ORDER BY {_MAX_VRAM} DESC, id LIMIT 1)",
        [node_id, NodeStatus.ONLINE.value, node_id],
    )
    return _nodes(found)
