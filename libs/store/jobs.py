"""Reads of the `jobs` projection: one job, and a page of a tenant's jobs.

Rows are written only by the append path (`eventstore` + `projections`).
"""

from __future__ import annotations

from libs.domain.job.model import Job

from .eventstore import EventStore
from .pool import live_page, rows


async def get(store: EventStore, job_id: str) -> Job | None:
    found = await rows(store, "SELECT doc FROM jobs WHERE id = %s AND deleted_at IS NULL", [job_id])
    return Job.model_validate(found[0]["doc"]) if found else None


async def page(
    store: EventStore, tenant_id: str | None, status: str | None, page: int, per_page: int
) -> tuple[list[Job], int]:
    """Live jobs, newest first, and the total that matches."""
    found, total = await live_page(store, "jobs", tenant_id, status, page, per_page)
    return [Job.model_validate(r["doc"]) for r in found], total
