"""Timeline reads for GET /tasks/{id}/events, /task-groups/{id}/events and /nodes/{id}/events:
newest first."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import Request

from libs.domain.errors import Code, DomainError
from libs.store import tasks as task_rows
from libs.store import timeline as timeline_rows
from libs.store.eventstore import EventStore
from libs.store.timeline import TimelineEntry


def page_params(request: Request) -> tuple[int, int]:
    params = dict(request.query_params)
    unknown = sorted(set(params) - {"page", "per_page"})
    if unknown:
        raise DomainError(
            Code.UNKNOWN_FIELD, f"unknown query parameter(s): {', '.join(unknown)}", unknown
        )
    try:
        page, per_page = int(params.get("page", 1)), int(params.get("per_page", 50))
    except ValueError:
        raise DomainError(
            Code.INVALID_VALUE, "page and per_page must be integers", ["page", "per_page"]
        ) from None
    if page < 1 or not 1 <= per_page <= 200:
        raise DomainError(
            Code.INVALID_VALUE, "page >= 1 and per_page in 1..200", ["page", "per_page"]
        )
    return page, per_page


def _body(entries: list[TimelineEntry], total: int, page: int, per_page: int) -> dict[str, Any]:
    return {
        "events": [asdict(e) | {"occurred_at": e.occurred_at.isoformat()} for e in entries],
        "total": total,
        "page": page,
        "per_page": per_page,
    }


async def task_timeline(
    store: EventStore, task_id: str, page: int, per_page: int
) -> dict[str, Any]:
    return _body(*await timeline_rows.task_page(store, task_id, page, per_page), page, per_page)


async def node_timeline(
    store: EventStore, node_id: str, page: int, per_page: int
) -> dict[str, Any]:
    return _body(*await timeline_rows.node_page(store, node_id, page, per_page), page, per_page)


async def group_timeline(
    store: EventStore, group_id: str, page: int, per_page: int
) -> dict[str, Any]:
    members = await task_rows.ids_of_group(store, group_id)
    entries, total = await timeline_rows.group_page(store, group_id, members, page, per_page)
    return _body(entries, total, page, per_page)
