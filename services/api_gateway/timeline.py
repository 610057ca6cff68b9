"""Timeline reads for GET /tasks/{id}/events and /task-groups/{id}/events: newest first."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from libs.domain.errors import Code, DomainError
from libs.store.eventstore import EventStore


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


async def read(
    store: EventStore, where: str, args: list[Any], page: int, per_page: int
) -> dict[str, Any]:
    rows = await store.fetch(
        "SELECT id, subject_type, subject_id, kind, message, details, occurred_at,"
        f" count(*) OVER () AS total FROM timeline WHERE {where}"
        " ORDER BY occurred_at DESC, id DESC LIMIT %s OFFSET %s",
        [*args, per_page, (page - 1) * per_page],
    )
    events = [
        {k: (v.isoformat() if k == "occurred_at" else v) for k, v in r.items() if k != "total"}
        for r in rows
    ]
    return {
        "events": events,
        "total": int(rows[0]["total"]) if rows else 0,
        "page": page,
        "per_page": per_page,
    }


async def task_timeline(
    store: EventStore, task_id: str, page: int, per_page: int
) -> dict[str, Any]:
    return await read(store, "subject_type = 'task' AND subject_id = %s", [task_id], page, per_page)


async def group_timeline(
    store: EventStore, group_id: str, page: int, per_page: int
) -> dict[str, Any]:
    where = (
        "(subject_type = 'group' AND subject_id = %s) OR (subject_type = 'task' AND"
        " subject_id IN (SELECT id FROM tasks WHERE group_id = %s))"
    )
    return await read(store, where, [group_id, group_id], page, per_page)
