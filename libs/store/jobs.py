"""Reads of the `jobs` projection: one job, and a page of a tenant's jobs.

Rows are written only by the append path (`eventstore` + `projections`).
"""

from __future__ import annotations

from typing import Any

from libs.domain.job_state import Job

from .eventstore import EventStore
from .pool import rows


async def get(store: EventStore, job_id: str) -> Job | None:
    found = await rows(store, "SELECT doc FROM jobs WHERE id = %s AND deleted_at IS NULL", [job_id])
    return Job.model_validate(found[0]["doc"]) if found else None


async def page(
    store: EventStore, tenant_id: str | None, status: str | None, page: int, per_page: int
) -> tuple[list[Job], int]:
    """Live jobs, newest first, and the total that matches."""
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
        f"SELECT doc, count(*) OVER () AS total FROM jobs WHERE {clause}"
        " ORDER BY created_at DESC, id LIMIT %s OFFSET %s",
        [*args, per_page, (page - 1) * per_page],
    )
    return [Job.model_validate(r["doc"]) for r in found], int(found[0]["total"]) if found else 0
