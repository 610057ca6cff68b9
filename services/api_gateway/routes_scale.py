"""`POST /api/v1/task-groups/{id}/scale`: change a group's replica count by hand.

The group event and the new member tasks are one transaction (the group row is locked
while the plan is made). A scale-down then sheds the members beyond the new size the way
the AutoScaler does (libs/domain/group/shedding.py): running ones are marked draining (the
AutoScaler stops them once no router has a request in flight on them, or after 120 s),
others are stopped at once. Which replicas of a `split` group go depends on the routers'
outstanding requests, which this process does not hear: that choice is left to the
AutoScaler's next reconcile pass (docs/autoscaling.md).
Static-world groups answer 400; a suspended tenant may scale down but not up (403).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends

from libs import auth
from libs.domain.group.autoscale import MIN_REPLICA_AGE_S
from libs.domain.group.model import Group, Parallelism
from libs.domain.group.scaling import ScalePlan, check_scalable, decide_scale, parse_replicas
from libs.domain.group.shedding import candidates, plan_shed, shed_commands
from libs.domain.payload import Payload
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
    split = group.spec.shape.parallelism is Parallelism.SPLIT
    shed = plan_shed(
        candidates(tasks, datetime.now(UTC)),
        replicas,
        split=split,
        min_age_s=MIN_REPLICA_AGE_S,
        outstanding=None,
    )

    def decide(current: Group | None) -> tuple[list[Payload], list[NewTask]]:
        nonlocal plan
        assert current is not None
        plan = decide_scale(
            current,
            tasks,
            replicas,
            reason=f"scale requested by {principal.subject}",
            removed=None if not split else () if shed.deferred else shed.removed,
        )
        if plan.event is None:
            return [], []
        return [plan.event], list(plan.new_members(current))

    updated, _ = await store.execute_with_tasks(
        GROUPS, group.id, decide, metadata={"principal": principal.subject}
    )
    if plan.event is not None and not shed.deferred and not shed.empty:
        await store.execute_batch(
            shed_commands(shed, actor_of(principal), "removed by a scale-down"),
            metadata={"principal": principal.subject},
        )
    assert updated is not None
    body_out = group_view(updated, await _tasks(store, group.id))
    return body_out | {"replicas": updated.size}
