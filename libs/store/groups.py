"""Reads of the `groups` projection: one group, a page of groups, the groups a controller
scan looks at, and the static-world groups among the scheduler's pending tasks.

Rows are written only by the append path (`eventstore` + `projections`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import timedelta
from typing import Any

from libs.domain.group import Group, GroupStatus

from .eventstore import EventStore
from .pool import rows


def _groups(found: list[dict[str, Any]]) -> list[Group]:
    return [Group.model_validate(r["doc"]) for r in found]


async def get(store: EventStore, group_id: str, *, include_deleted: bool = False) -> Group | None:
    sql = "SELECT doc FROM groups WHERE id = %s"
    if not include_deleted:
        sql += " AND deleted_at IS NULL"
    found = await rows(store, sql, [group_id])
    return Group.model_validate(found[0]["doc"]) if found else None


async def by_ids(store: EventStore, ids: Sequence[str]) -> list[Group]:
    return _groups(await rows(store, "SELECT doc FROM groups WHERE id = ANY(%s)", [list(ids)]))


async def page(
    store: EventStore, tenant_id: str | None, status: str | None, page: int, per_page: int
) -> tuple[list[Group], int]:
    """Live groups, newest first, and the total that matches."""
    where, args = ["deleted_at IS NULL"], list[Any]()
    if tenant_id is not None:
        where.append("tenant_id = %s")
        args.append(tenant_id)
    if status:
        where.append("status = %s")
        args.append(status)
    clause = " AND ".join(where)
    found = await rows(
        store,
        f"SELECT doc, count(*) OVER () AS total FROM groups WHERE {clause}"
        " ORDER BY created_at DESC, id LIMIT %s OFFSET %s",
        [*args, per_page, (page - 1) * per_page],
    )
    return _groups(found), int(found[0]["total"]) if found else 0


async def live_or_recent(
    store: EventStore, terminal: Collection[GroupStatus], within: timedelta
) -> list[Group]:
    """Groups not deleted that are still live, or reached `terminal` less than `within` ago."""
    found = await rows(
        store,
        "SELECT doc FROM groups WHERE deleted_at IS NULL AND"
        " (status <> ALL(%s) OR updated_at > now() - %s)",
        [[s.value for s in terminal], within],
    )
    return _groups(found)


async def with_windows(store: EventStore) -> list[Group]:
    """Live groups that carry a schedule window (the window controller's scan)."""
    found = await rows(
        store,
        "SELECT doc FROM groups WHERE deleted_at IS NULL"
        " AND jsonb_typeof(doc->'spec'->'schedule_window') = 'object' ORDER BY id",
    )
    return _groups(found)
