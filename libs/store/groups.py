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
from .pool import live_page, rows


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
    found, total = await live_page(store, "groups", tenant_id, status, page, per_page)
    return _groups(found), total


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


async def with_active_rollout(store: EventStore, phases: Collection[str]) -> list[Group]:
    """Live groups whose rollout is in one of `phases` (the rollout controller's scan)."""
    found = await rows(
        store,
        "SELECT doc FROM groups WHERE deleted_at IS NULL"
        " AND doc->'rollout'->>'phase' = ANY(%s) ORDER BY id",
        [list(phases)],
    )
    return _groups(found)
