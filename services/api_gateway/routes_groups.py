"""`/api/v1/task-groups`: create, get (with members), list, stop, sleep, wake, delete, update.

Membership is created only here: a group and its `task_count` member tasks (ranks
0..n-1) are one transaction.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import structlog
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from libs import auth
from libs.auth import Principal as PrincipalT
from libs.domain.errors import NotFound
from libs.domain.group.events import GroupCreated, GroupDeleted
from libs.domain.group.model import (
    Group,
    GroupSpec,
    current_members,
    is_live,
    parse_group,
    sized_members,
)
from libs.domain.group.update import parse_group_update
from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.task import decide as commands
from libs.domain.task.lending import decide_wake
from libs.domain.task.model import Task, TenantId, boost_line, tenant_allow_list
from libs.domain.task.states import TaskStatus
from libs.store import groups as group_rows
from libs.store import tasks as task_rows
from libs.store.eventstore import EventStore, NewTask
from libs.store.projections import GROUPS
from libs.store.types import GroupQuery

from . import planning, request_docs, timeline
from .as_of import AsOf, group_at
from .deps import Principal, Store, tenant_scope
from .queueing import into_queue
from .responses import FastJSONResponse
from .routes_tasks import FOR_TENANT, actor_of, tenant_for_create
from .schemas import GroupListQuery, GroupUpdate, TimelineQuery, documented_body, query_of
from .views import task_view

router = APIRouter(prefix="/api/v1/task-groups", tags=["task-groups"])
log = structlog.get_logger(__name__)
CreateBody = Annotated[dict[str, Any], Depends(documented_body(request_docs.group_create))]
# The route names its own refusals (40020 for any other field), equal to the model's rules.
UpdateBody = Annotated[dict[str, Any], Depends(documented_body(request_docs.of(GroupUpdate)))]
ListQuery = Annotated[GroupListQuery, Depends(query_of(GroupListQuery))]
S = TaskStatus


def group_view(group: Group, tasks: list[Task] | None = None) -> dict[str, Any]:
    shape = group.spec.shape.model_dump(mode="json")
    body: dict[str, Any] = {
        "id": group.id,
        "tenant_id": group.tenant_id,
        "name": group.spec.template.name,
        "status": group.status.value,
        "reason": group.reason,
        "reason_code": group.reason_code.value,
        "task_type": group.spec.template.task_type.value,
        "static_world": group.spec.static_world,
        **shape,
        "template": group.spec.template.model_dump(mode="json"),
        "replicas": group.size,
        "schedule_window": (
            group.spec.schedule_window.model_dump(mode="json")
            if group.spec.schedule_window
            else None
        ),
        "auto_scale": (
            group.spec.auto_scale.model_dump(mode="json") if group.spec.auto_scale else None
        ),
        "last_autoscale": (
            group.last_autoscale.model_dump(mode="json") if group.last_autoscale else None
        ),
        "group_labels": group.labels,
        "restarts": group.restarts,
        "rebuilds": group.rebuilds,
        "replacements": group.replacements,
        "created_at": group.created_at.isoformat(),
        "updated_at": group.updated_at.isoformat(),
    }
    if tasks is not None:
        members = sized_members(group, current_members(tasks))
        body["tasks"] = [task_view(t) for t in members]
        body["superseded_tasks"] = sorted(t.id for t in tasks if t not in members)
    return body


async def _load(store: EventStore, group_id: str, tenant: str | None) -> Group:
    group = await group_rows.get(store, group_id)
    if group is None or (tenant is not None and group.tenant_id != tenant):
        raise NotFound("task group")
    return group


async def _tasks(store: EventStore, group_id: str) -> list[Task]:
    return await task_rows.of_group(store, group_id, include_deleted=False)


async def group_submission(
    request: Request, principal: PrincipalT, store: EventStore, body: dict[str, Any]
) -> tuple[str, GroupSpec]:
    """A create body parsed into (tenant, spec with its template in its queue): the create's
    and the plan's one parse, so both refuse a bad body alike."""
    tenant_id = tenant_for_create(principal, request)
    await auth.admit_tenant(store, tenant_id, request.app.state.auth_cache)
    spec: GroupSpec = parse_group(
        body,
        tenant=principal.is_tenant,
        volume_allow_list=tenant_allow_list(
            request.app.state.settings.volume_allow_list, tenant_id
        ),
        defaults=request.app.state.settings.task_defaults(),
    )
    template = await into_queue(store, tenant_id, spec.template)
    return tenant_id, spec.model_copy(update={"template": template})


@router.post("", status_code=201, dependencies=FOR_TENANT)
async def create_group(
    request: Request, principal: Principal, store: Store, body: CreateBody
) -> JSONResponse:
    tenant_id, spec = await group_submission(request, principal, store, body)
    template = spec.template
    group_id = "grp-" + uuid.uuid4().hex[:16]

    def decide(_: Group | None) -> tuple[list[Payload], list[NewTask]]:
        tasks: list[NewTask] = [
            (TenantId(tenant_id), spec.member_spec(r), group_id, r)
            for r in range(spec.shape.task_count)
        ]
        return [GroupCreated(group_id=group_id, tenant_id=TenantId(tenant_id), spec=spec)], tasks

    group, tasks = await store.execute_with_tasks(
        GROUPS, group_id, decide, metadata={"principal": principal.subject}
    )
    assert group is not None
    if line := boost_line(body, template):
        log.info(line, group_id=group_id)
    return FastJSONResponse(group_view(group, tasks), status_code=201)


@router.get("")
async def list_groups(query: ListQuery, principal: Principal, store: Store) -> dict[str, Any]:
    q = GroupQuery(tenant_id=tenant_scope(principal), **query.filters())
    found, total = await group_rows.page(store, q)
    return {
        "groups": [group_view(g) for g in found],
        "total": total,
        "page": q.page,
        "per_page": q.per_page,
    }


@router.get("/stats")
async def group_stats(principal: Principal, store: Store) -> dict[str, Any]:
    """Live groups by status, as `GET /tasks/stats` counts tasks."""
    counts = await group_rows.stats(store, tenant_scope(principal))
    return {"total": sum(counts.values()), "by_status": counts}


@router.get("/{group_id}")
async def get_group(group_id: str, principal: Principal, store: Store, q: AsOf) -> dict[str, Any]:
    if (at := q.at()) is not None:
        return group_view(*await group_at(store, group_id, tenant_scope(principal), at))
    group = await _load(store, group_id, tenant_scope(principal))
    tasks = await _tasks(store, group_id)
    return await planning.with_first_pending(store, group_view(group, tasks), tasks)


async def _each_member(
    store: EventStore, group: Group, decide: commands.Decide, actor: str
) -> dict[str, Any]:
    members = [m for m in current_members(await _tasks(store, group.id)) if is_live(m)]
    done, refused = await store.execute_batch(
        {m.id: decide for m in members}, metadata={"principal": actor}
    )
    return {
        "id": group.id,
        "changed": sorted(done),
        "skipped": {k: v.message for k, v in refused.items()},
    }


@router.get("/{group_id}/events", dependencies=[Depends(query_of(TimelineQuery))])
async def group_events(
    request: Request, group_id: str, principal: Principal, store: Store
) -> dict[str, Any]:
    """The group's timeline (its own entries and its members'), newest first."""
    page, per_page = timeline.page_params(request)
    group = await _load(store, group_id, tenant_scope(principal))
    return {"group_id": group.id} | await timeline.group_timeline(store, group.id, page, per_page)


@router.post("/{group_id}/stop")
async def stop_group(group_id: str, principal: Principal, store: Store) -> dict[str, Any]:
    group = await _load(store, group_id, tenant_scope(principal))
    actor = actor_of(principal)
    return await _each_member(
        store, group, lambda t: commands.decide_stop(t, actor), principal.subject
    )


@router.post("/{group_id}/sleep")
async def sleep_group(group_id: str, principal: Principal, store: Store) -> dict[str, Any]:
    group = await _load(store, group_id, tenant_scope(principal))
    actor = actor_of(principal)
    return await _each_member(
        store,
        group,
        lambda t: commands.decide_sleep(t, actor) if t.status is S.RUNNING else [],
        principal.subject,
    )


@router.post("/{group_id}/wake")
async def wake_group(group_id: str, principal: Principal, store: Store) -> dict[str, Any]:
    group = await _load(store, group_id, tenant_scope(principal))
    actor = actor_of(principal)
    return await _each_member(
        store,
        group,
        # A member whose card is lent queues its wake (libs/domain/task/lending.py).
        lambda t: (
            decide_wake(t, actor, ReasonCode.USER_WAKE, "group wake")
            if t.status is S.SLEEPING
            else []
        ),
        principal.subject,
    )


@router.delete("/{group_id}")
async def delete_group(group_id: str, principal: Principal, store: Store) -> dict[str, Any]:
    group = await _load(store, group_id, tenant_scope(principal))
    actor = actor_of(principal)
    tasks = await _tasks(store, group.id)
    await store.execute_batch({t.id: (lambda t: commands.decide_delete(t, actor)) for t in tasks})
    await store.execute_aggregate(GROUPS, group.id, lambda _g: [GroupDeleted(group_id=group.id)])
    return {"message": "task group deleted", "id": group.id}


@router.put("/{group_id}")
async def update_group(
    group_id: str, principal: Principal, store: Store, body: UpdateBody
) -> dict[str, Any]:
    group = await _load(store, group_id, tenant_scope(principal))
    events, changes = parse_group_update(group, body)
    updated = await store.execute_aggregate(GROUPS, group.id, lambda _g: events)
    if changes:
        await _each_member(
            store, group, lambda t: commands.decide_config_update(t, changes), principal.subject
        )
    assert updated is not None
    return group_view(updated, await _tasks(store, group.id))
