"""`/api/v1/task-groups/{id}/rollout`: start a rolling update, read it, pause/resume/rollback.

The gateway only records intent as group events (one compare-and-set on the group stream
raises its generation); replacing replicas batch by batch is the rollout controller's work
(services/rollout, docs/rollout.md), whose batch history this view shows.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from libs.domain.errors import NotFound
from libs.domain.group.model import Group
from libs.domain.rollout.decide import decide_action, decide_start
from libs.domain.task.model import Task, tenant_allow_list
from libs.domain.task.states import TERMINAL
from libs.store import groups as group_rows
from libs.store import tasks as task_rows
from libs.store.eventstore import EventStore
from libs.store.projections import GROUPS

from . import request_docs
from .deps import Principal, Store, tenant_scope
from .responses import FastJSONResponse
from .schemas import documented_body

router = APIRouter(prefix="/api/v1/task-groups", tags=["rollout"])


async def _load(store: EventStore, group_id: str, tenant: str | None) -> Group:
    group = await group_rows.get(store, group_id)
    if (
        group is None
        or group.deleted_at is not None
        or (tenant is not None and group.tenant_id != tenant)
    ):
        raise NotFound("task group")
    return group


def rollout_view(group: Group, tasks: list[Task]) -> dict[str, Any]:
    """Generation, phase and the replicas of each generation (live, draining)."""
    live = [t for t in tasks if t.status not in TERMINAL]
    per_gen = Counter(t.generation for t in live)
    draining = Counter(t.generation for t in live if t.draining)
    rollout = group.rollout
    return {
        "group_id": group.id,
        "generation": group.generation,
        "rollout_id": rollout.id if rollout else None,
        "phase": rollout.phase.value if rollout else None,
        "reason": rollout.reason if rollout else "",
        "reason_code": rollout.reason_code.value if rollout else None,
        "request": rollout.request.model_dump(mode="json") if rollout else None,
        "replicas": [
            {"generation": g, "live": per_gen[g], "draining": draining[g]} for g in sorted(per_gen)
        ],
        "batches": [b.model_dump(mode="json") for b in rollout.batches] if rollout else [],
        "holder": rollout.holder if rollout else "",
        "lease_renewed_at": (
            rollout.lease_renewed_at.isoformat() if rollout and rollout.lease_renewed_at else None
        ),
    }


@router.post("/{group_id}/rollout", status_code=202)
async def start_rollout(
    request: Request,
    group_id: str,
    principal: Principal,
    store: Store,
    body: Annotated[dict[str, Any], Depends(documented_body(request_docs.rollout))],
) -> JSONResponse:
    group = await _load(store, group_id, tenant_scope(principal))
    allow = tenant_allow_list(request.app.state.settings.volume_allow_list, group.tenant_id)
    rollout_id = "ro-" + uuid.uuid4().hex[:16]
    updated = await store.execute_aggregate(
        GROUPS,
        group.id,
        lambda g: decide_start(g or group, body, rollout_id, volume_allow_list=allow),
        metadata={"principal": principal.subject},
    )
    assert updated is not None
    tasks = await task_rows.of_group(store, group.id, include_deleted=False)
    return FastJSONResponse(rollout_view(updated, tasks), status_code=202)


@router.get("/{group_id}/rollout")
async def get_rollout(group_id: str, principal: Principal, store: Store) -> dict[str, Any]:
    group = await _load(store, group_id, tenant_scope(principal))
    return rollout_view(group, await task_rows.of_group(store, group.id, include_deleted=False))


async def _act(group_id: str, action: str, principal: Any, store: EventStore) -> dict[str, Any]:
    group = await _load(store, group_id, tenant_scope(principal))
    updated = await store.execute_aggregate(
        GROUPS,
        group.id,
        lambda g: decide_action(g or group, action),
        metadata={"principal": principal.subject},
    )
    assert updated is not None
    return rollout_view(updated, await task_rows.of_group(store, group.id, include_deleted=False))


@router.post("/{group_id}/rollout/pause")
async def pause_rollout(group_id: str, principal: Principal, store: Store) -> dict[str, Any]:
    return await _act(group_id, "pause", principal, store)


@router.post("/{group_id}/rollout/resume")
async def resume_rollout(group_id: str, principal: Principal, store: Store) -> dict[str, Any]:
    return await _act(group_id, "resume", principal, store)


@router.post("/{group_id}/rollout/rollback")
async def rollback_rollout(group_id: str, principal: Principal, store: Store) -> dict[str, Any]:
    return await _act(group_id, "rollback", principal, store)
