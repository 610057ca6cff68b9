"""`POST /api/v1/task-groups/{id}/scale`: change a group's replica count by hand.

The group event and the new member tasks are one transaction (the group row is locked
while the plan is made); members of removed ranks are then stopped like a user stop.
Static-world groups answer 400; a suspended tenant may scale down but not up (403).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from libs import auth
from libs.domain.group.model import Group
from libs.domain.group.scaling import ScalePlan, check_scalable, decide_scale, parse_replicas
from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.task import decide as commands
from libs.store import tasks as task_rows
from libs.store.eventstore import NewTask
from libs.store.projections import GROUPS

from .deps import Principal, Store, tenant_scope
from .routes_groups import _load, _tasks, group_view
from .routes_tasks import actor_of
from .schemas import ScaleRequest, body_of

router = APIRouter(prefix="/api/v1/task-groups", tags=["task-groups"])


@router.post("/{group_id}/scale")
async def scale_group(
    group_id: str,
    principal: Principal,
    store: Store,
    req: Annotated[ScaleRequest, Depends(body_of(ScaleRequest))],
) -> dict[str, Any]:
    group = await _load(store, group_id, tenant_scope(principal))
    replicas = parse_replicas(req.replicas)
    check_scalable(group)
    if replicas > group.size:
        await auth.admit_tenant(store, group.tenant_id)  # uncached: a suspension counts now
    tasks = await task_rows.of_group(store, group.id, include_deleted=False)
    plan = ScalePlan()

    def decide(current: Group | None) -> tuple[list[Payload], list[NewTask]]:
        nonlocal plan
        assert current is not None
        plan = decide_scale(
            current, tasks, replicas, reason=f"scale requested by {principal.subject}"
        )
        if plan.event is None:
            return [], []
        return [plan.event], list(plan.new_members(current))

    updated, _ = await store.execute_with_tasks(
        GROUPS, group.id, decide, metadata={"principal": principal.subject}
    )
    actor = actor_of(principal)
    await store.execute_batch(
        {
            m.id: lambda t: commands.decide_stop(
                t, actor, ReasonCode.SCALED_DOWN, f"rank {t.rank} removed by a scale-down"
            )
            for m in plan.stop
        },
        metadata={"principal": principal.subject},
    )
    assert updated is not None
    body_out = group_view(updated, await _tasks(store, group.id))
    return body_out | {"replicas": updated.size}
