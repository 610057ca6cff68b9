"""Reads of the `groups` projection: one group, a page of groups, the groups a controller
scan looks at, and the static-world groups among the scheduler's pending tasks.

Rows are written only by the append path (`eventstore` + `projections`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import timedelta
from typing import Any

from psycopg.types.json import Jsonb

from libs.domain.group.model import Group, GroupStatus
from libs.domain.group.windows import ACTION_LABEL

from .eventstore import EventStore
from .pool import contains, page_of, rows
from .types import GroupQuery


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


# GET /task-groups `sort` values; priority is the member template's (no column of its own).
SORT_COLUMNS = {
    "created_at": "created_at",
    "updated_at": "updated_at",
    "priority": "(doc->'spec'->'template'->>'priority')::int",
}


async def page(store: EventStore, q: GroupQuery) -> tuple[list[Group], int]:
    """A page of GET /task-groups (filters as the task list's) and the total that matches."""
    where = ["deleted_at IS NULL"]
    params: list[Any] = []
    if q.tenant_id is not None:
        where.append("tenant_id = %s")
        params.append(q.tenant_id)
    if q.status:
        where.append("status = %s")
        params.append(q.status)
    if q.name:
        where.append("name ILIKE %s")
        params.append(contains(q.name))
    if q.labels:
        where.append("doc->'spec'->'template'->'labels' @> %s")
        params.append(Jsonb(q.labels))
    direction = "ASC" if q.order == "asc" else "DESC"
    order = f"{SORT_COLUMNS[q.sort]} {direction}, id {direction}"
    found, total = await page_of(store, "groups", where, params, order, q.page, q.per_page)
    return _groups(found), total


async def stats(store: EventStore, tenant_id: str | None) -> dict[str, int]:
    """Live groups by status (every status listed, zeros included), scoped like the list."""
    where = "deleted_at IS NULL" + (" AND tenant_id = %s" if tenant_id is not None else "")
    found = await rows(
        store,
        f"SELECT status, count(*) AS n FROM groups WHERE {where} GROUP BY status",
        [tenant_id] if tenant_id is not None else [],
    )
    counts = {s.value: 0 for s in GroupStatus}
    for r in found:
        counts[r["status"]] = int(r["n"])
    return counts


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
    """Live groups that carry a schedule window, or still hold a window's action after the
    window was removed (the window controller's scan)."""
    found = await rows(
        store,
        "SELECT doc FROM groups WHERE deleted_at IS NULL"
        " AND (jsonb_typeof(doc->'spec'->'schedule_window') = 'object'"
        " OR doc->'labels' ? %s) ORDER BY id",
        [ACTION_LABEL],
    )
    return _groups(found)


async def with_auto_scale(store: EventStore) -> list[Group]:
    """Live groups that carry an `auto_scale` configuration (the AutoScaler's scan)."""
    found = await rows(
        store,
        "SELECT doc FROM groups WHERE deleted_at IS NULL"
        " AND jsonb_typeof(doc->'spec'->'auto_scale') = 'object' ORDER BY id",
    )
    return _groups(found)


async def scalable(store: EventStore) -> list[Group]:
    """Live groups that were ever scaled or carry `auto_scale` (the AutoScaler's reconcile
    pass: members beyond the size still live, drains to end)."""
    found = await rows(
        store,
        "SELECT doc FROM groups WHERE deleted_at IS NULL"
        " AND (jsonb_typeof(doc->'replicas') = 'number'"
        " OR jsonb_typeof(doc->'spec'->'auto_scale') = 'object') ORDER BY id",
    )
    return _groups(found)


async def with_active_rollout(store: EventStore, phases: Collection[str]) -> list[Group]:
    """Live groups whose rollout is in one of `phases` (the rollout controller's scan)."""
    found = await rows(
        store,
        "SELECT doc FROM groups WHERE deleted_at IS NULL"
        " AND doc->'rollout'->>'phase' = ANY(%s) ORDER BY id",
        [list(phases)],
    )
    return _groups(found)
