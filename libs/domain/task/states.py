"""The task state machine: the fourteen states, the sets derived from them and the one
transition whitelist every writer goes through (SPEC §1).

Nothing else in the code base may decide whether a status change is legal. The API, the
scheduler, the retry engine, agent reports and the controllers all call `check_transition`.
"""

from __future__ import annotations

from enum import StrEnum


class TaskStatus(StrEnum):
    PENDING = "pending"
    SCHEDULED = "scheduled"
    STARTING = "starting"
    RUNNING = "running"
    SLEEPING = "sleeping"
    WAKING = "waking"
    STOPPING = "stopping"
    DRAINING = "draining"
    PREEMPTING = "preempting"
    PAUSED = "paused"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STOPPED = "stopped"


class Actor(StrEnum):
    """Who asks for a transition. Some edges belong to one actor only."""

    TENANT = "tenant"
    OPERATOR = "operator"
    AGENT = "agent"
    SCHEDULER = "scheduler"
    RETRY_ENGINE = "retry_engine"
    CONTROLLER = "controller"


S = TaskStatus

TERMINAL: frozenset[TaskStatus] = frozenset({S.COMPLETED, S.FAILED, S.CANCELLED, S.STOPPED})

# Node capacity AND tenant quota both count exactly this set (one definition, SPEC §1).
GPU_HOLDING: frozenset[TaskStatus] = frozenset(
    {S.SCHEDULED, S.STARTING, S.RUNNING, S.SLEEPING, S.WAKING, S.STOPPING, S.DRAINING, S.PREEMPTING}
)

# Statuses a node loss sends back to `pending`; `stopping`/`draining` end in place instead.
MIGRATE_ON_NODE_LOSS: frozenset[TaskStatus] = frozenset(
    {S.SCHEDULED, S.STARTING, S.RUNNING, S.WAKING}
)

TRANSITIONS: dict[TaskStatus, frozenset[TaskStatus]] = {
    S.PENDING: frozenset({S.SCHEDULED, S.CANCELLED, S.FAILED}),
    S.SCHEDULED: frozenset(
        {S.STARTING, S.RUNNING, S.PENDING, S.STOPPING, S.PREEMPTING, S.FAILED, S.CANCELLED}
    ),
    S.STARTING: frozenset({S.RUNNING, S.COMPLETED, S.FAILED, S.PENDING, S.STOPPING}),
    S.RUNNING: frozenset(
        {S.COMPLETED, S.FAILED, S.SLEEPING, S.STOPPING, S.DRAINING, S.PREEMPTING, S.PENDING}
    ),
    S.SLEEPING: frozenset({S.WAKING, S.STOPPING, S.PENDING, S.FAILED}),
    S.WAKING: frozenset({S.RUNNING, S.PENDING, S.FAILED, S.STOPPING}),
    # Never `completed`: a task somebody decided to stop is not a success.
    S.STOPPING: frozenset({S.STOPPED, S.FAILED}),
    S.DRAINING: frozenset({S.CANCELLED, S.STOPPED, S.FAILED}),
    S.PREEMPTING: frozenset({S.PENDING, S.STOPPED, S.FAILED}),
    # Reserved: nothing enters it; its exits only recover old data.
    S.PAUSED: frozenset({S.PENDING, S.STOPPED}),
    S.COMPLETED: frozenset(),
    # Only the retry engine, only while retries remain (checked by the caller holding the task).
    S.FAILED: frozenset({S.PENDING}),
    S.CANCELLED: frozenset(),
    S.STOPPED: frozenset(),
}

# Edges reserved for one actor.
_ACTOR_ONLY: dict[tuple[TaskStatus, TaskStatus], frozenset[Actor]] = {
    (S.FAILED, S.PENDING): frozenset({Actor.RETRY_ENGINE}),
}

# Defence in depth on the report path (agents and operators reporting execution results):
# even if the whitelist above were edited by mistake, these stay refused.
REPORT_BLACKLIST: frozenset[tuple[TaskStatus, TaskStatus]] = frozenset(
    {(S.STOPPING, S.COMPLETED), (S.PENDING, S.COMPLETED)} | {(src, S.PAUSED) for src in TaskStatus}
)


class IllegalTransition(ValueError):
    """A status change the whitelist does not allow; carries a message naming both ends."""

    def __init__(self, src: TaskStatus, dst: TaskStatus, why: str = "") -> None:
        self.src = src
        self.dst = dst
        detail = f": {why}" if why else ""
        super().__init__(f"illegal transition {src.value} -> {dst.value}{detail}")


def is_allowed(src: TaskStatus, dst: TaskStatus, actor: Actor | None = None) -> bool:
    """True when the whitelist allows src -> dst for this actor (None = any actor)."""
    if dst not in TRANSITIONS[src]:
        return False
    owners = _ACTOR_ONLY.get((src, dst))
    return owners is None or (actor is not None and actor in owners)


def check_transition(
    src: TaskStatus, dst: TaskStatus, actor: Actor, *, report: bool = False
) -> None:
    """Raise IllegalTransition unless src -> dst is legal for actor.

    `report=True` marks the agent/operator report path, which applies the blacklist again.
    """
    if report and (src, dst) in REPORT_BLACKLIST:
        raise IllegalTransition(src, dst, "refused on the report path")
    if dst not in TRANSITIONS[src]:
        raise IllegalTransition(src, dst)
    owners = _ACTOR_ONLY.get((src, dst))
    if owners is not None and actor not in owners:
        names = ", ".join(sorted(a.value for a in owners))
        raise IllegalTransition(src, dst, f"only {names} may do this")
