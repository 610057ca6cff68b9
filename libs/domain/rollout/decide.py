"""Rolling update of a task group: the request a user sends and the per-task decisions.

What a rollout may change (image, env, volumes) and how fast (max_surge, max_unavailable,
partition, health_timeout_s) is validated here with the entry discipline of SPEC §2: unknown
fields are named, values are checked, a static-world group is refused with the alternative
(`strategy: recreate`), because replacing ranks of a fixed world one by one is a restart.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from libs.domain.errors import Code, DomainError
from libs.domain.group.model import Group, GroupSpec
from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.rollout.events import RolloutPartitionChanged, RolloutStarted
from libs.domain.rollout.model import ACTIVE, FIELDS, RolloutPhase, RolloutRequest
from libs.domain.rollout.plan import phase_change
from libs.domain.task.events import TaskDrainMarked
from libs.domain.task.model import Task, TaskSpec, check_host_paths
from libs.domain.task.states import TERMINAL
from libs.domain.validation import check_task_spec


def parse_rollout(raw: Any, group: GroupSpec) -> RolloutRequest:
    """The validated request, or a DomainError naming every field that is wrong."""
    if not isinstance(raw, dict):
        raise DomainError(Code.INVALID_VALUE, "the body must be a JSON object", ["body"])
    unknown = sorted(k for k in raw if k not in FIELDS)
    if unknown:
        raise DomainError(Code.UNKNOWN_FIELD, f"unknown field(s): {', '.join(unknown)}", unknown)
    try:
        req = RolloutRequest.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        unknown = sorted(
            {".".join(str(x) for x in e["loc"]) for e in errors if e["type"] == "extra_forbidden"}
        )
        if unknown:  # a nested one (`volumes.0.mode`) as a top-level one: 40001
            raise DomainError(
                Code.UNKNOWN_FIELD, f"unknown field(s): {', '.join(unknown)}", unknown
            ) from exc
        fields = sorted({".".join(str(x) for x in e["loc"]) or "body" for e in exc.errors()})
        raise DomainError(
            Code.INVALID_VALUE, f"invalid value(s): {', '.join(fields)}", fields
        ) from exc
    if req.image is None and req.env is None and req.volumes is None:
        raise DomainError(
            Code.INVALID_VALUE, "nothing to roll out: give image, env or volumes", ["image"]
        )
    if req.strategy == "rolling" and req.max_surge == 0 and req.max_unavailable == 0:
        raise DomainError(
            Code.INVALID_VALUE,
            "max_surge and max_unavailable are both 0: no replica could ever be replaced; "
            "allow at least one extra replica (max_surge) or one replica out of service "
            "(max_unavailable)",
            ["max_surge", "max_unavailable"],
        )
    if group.static_world and req.strategy == "rolling":
        raise DomainError(
            Code.INVALID_VALUE,
            "a rolling update of a static-world (training) group is a restart of the whole "
            'world: send "strategy": "recreate" to restart it with the new configuration',
            ["strategy"],
        )
    return req


def decide_drain(task: Task) -> list[TaskDrainMarked]:
    """Mark an old-generation replica draining; nothing when it already is or has ended."""
    if task.draining or task.status in TERMINAL:
        return []
    code = ReasonCode.ROLLOUT_DRAIN
    return [TaskDrainMarked(task_id=task.id, reason_code=code, reason=code.text)]


def target_template(previous: TaskSpec, req: RolloutRequest) -> TaskSpec:
    """The new member template: the user's intent kept, only what the request names replaced."""
    update: dict[str, Any] = {}
    if req.image is not None:
        update["image"] = req.image
    if req.env is not None:
        update["env"] = req.env
    if req.volumes is not None:
        update["volumes"] = req.volumes
    return previous.model_copy(update=update)


def _active(group: Group) -> bool:
    return group.rollout is not None and group.rollout.phase in ACTIVE


def decide_start(
    group: Group, raw: Any, rollout_id: str, *, volume_allow_list: Iterable[str] = ()
) -> list[RolloutStarted | RolloutPartitionChanged]:
    """Start a rollout (generation + 1), or move the canary partition of the active one.
    New volumes must lie under the group tenant's allow-list (`tenant_allow_list`), as at
    create: 400 naming the volume."""
    if group.deleted_at is not None:
        raise DomainError(Code.NOT_FOUND, "task group not found")
    if _active(group):
        assert group.rollout is not None
        if isinstance(raw, dict) and set(raw) == {"partition"}:
            req = parse_partition(raw)
            return [
                RolloutPartitionChanged(
                    group_id=group.id, rollout_id=group.rollout.id, partition=req.partition
                )
            ]
        raise DomainError(
            Code.INVALID_STATUS_FOR_OPERATION,
            f"rollout {group.rollout.id} is {group.rollout.phase.value}: only its partition "
            "can change until it completes, fails or is rolled back",
            sorted(raw) if isinstance(raw, dict) else [],
        )
    req = parse_rollout(raw, group.spec)
    check_surge(req, group)
    previous = group.spec.template
    # The new template meets every limit a created task meets (image reference, env, volume
    # paths), each refusal naming its field.
    target = check_task_spec(target_template(previous, req))
    if req.volumes is not None:
        check_host_paths([vol.host_path for vol in target.volumes], volume_allow_list)
    return [
        RolloutStarted(
            group_id=group.id,
            rollout_id=rollout_id,
            generation=group.generation + 1,
            request=req,
            previous=previous,
            target=target,
        )
    ]


def check_surge(req: RolloutRequest, group: Group) -> None:
    """The surge allowance: during a rollout the tenant may hold at most `max_surge`
    replicas' cards over its GPU quota, and never more surge replicas than the rollout
    replaces (a larger surge would only hold cards nobody needs)."""
    replaced = group.size if req.partition is None else min(req.partition, group.size)
    if req.strategy == "rolling" and req.max_surge > max(replaced, 1):
        raise DomainError(
            Code.INVALID_VALUE,
            f"max_surge {req.max_surge} is beyond the surge allowance: this rollout replaces "
            f"{replaced} replica(s), and a tenant may exceed its GPU quota by at most the "
            "cards of that many surge replicas",
            ["max_surge"],
        )


def parse_partition(raw: dict[str, Any]) -> RolloutRequest:
    try:
        return RolloutRequest.model_validate(raw)
    except ValidationError as exc:
        raise DomainError(
            Code.INVALID_VALUE, "partition must be an integer >= 0", ["partition"]
        ) from exc


# action -> (phases it applies to, phase it leads to)
_ACTIONS: dict[str, tuple[frozenset[RolloutPhase], RolloutPhase]] = {
    "pause": (frozenset({RolloutPhase.RUNNING}), RolloutPhase.PAUSED),
    "resume": (frozenset({RolloutPhase.PAUSED}), RolloutPhase.RUNNING),
    "rollback": (frozenset({RolloutPhase.RUNNING, RolloutPhase.PAUSED}), RolloutPhase.ROLLBACK),
}


def decide_action(group: Group, action: str) -> list[Payload]:
    """pause | resume | rollback of the group's rollout, refused outside its phases."""
    allowed, to = _ACTIONS[action]
    rollout = group.rollout
    if rollout is None or rollout.phase not in allowed:
        phase = rollout.phase.value if rollout else "none"
        raise DomainError(
            Code.INVALID_STATUS_FOR_OPERATION,
            f"cannot {action} a rollout in phase {phase} "
            f"(allowed from: {', '.join(sorted(p.value for p in allowed))})",
        )
    # A requested rollback puts the group in `rollback` while the old config is restored.
    return phase_change(group, rollout, to, ReasonCode.ROLLOUT_ACTION, f"{action} requested")
