"""The decisions that depend on a task's host or on a serving target's idleness: a wake
(SPEC §2: `waking`, or back to `pending` when the host is offline), the end of a stop on a
lost host (SPEC §3), and idle sleep (no request for `idle_timeout_minutes`). Pure: the
callers read the node's status and the router figures; the gateway applies a wake or a
stop in the transaction that read the node (libs/store/tasks.py `execute_by_host`), the
idle-sleep controller (services/autoscaler/controllers/idle_sleep.py) the sleeps.
"""

from __future__ import annotations

from dataclasses import dataclass

from libs.domain.errors import Code, DomainError
from libs.domain.group.model import current_members
from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.task.decide import decide_transition
from libs.domain.task.lending import decide_wake as wake_here
from libs.domain.task.model import Task
from libs.domain.task.states import TERMINAL, Actor, TaskStatus

S = TaskStatus
OFFLINE_WAKE_REASON = "wake: host offline"


def decide_wake(
    task: Task, node_online: bool, actor: Actor, reason_code: ReasonCode, reason: str = ""
) -> list[Payload]:
    """Wake a sleeping task: on an online host `waking` (queued while its card is lent,
    libs/domain/task/lending.py); with its host offline (or none) back to `pending`, its placement
    cleared, to be placed elsewhere."""
    if task.status is not S.SLEEPING:
        raise DomainError(
            Code.INVALID_STATUS_FOR_OPERATION,
            f"task is not sleeping, current status: {task.status.value}",
        )
    if node_online:
        return wake_here(task, actor, reason_code, reason)
    return list(
        decide_transition(
            task,
            S.PENDING,
            actor=actor,
            expected_status=S.SLEEPING,
            reason_code=ReasonCode.HOST_OFFLINE_ON_WAKE,
            reason=OFFLINE_WAKE_REASON,
            clear_placement=True,
        )
    )


def decide_stop_on_lost_host(task: Task, node_online: bool) -> list[Payload]:
    """A task told to stop on a node that is offline ends `stopped` now: no agent is there
    to report it. Nothing for any other task."""
    if task.status is not S.STOPPING or not task.node_id or node_online:
        return []
    why = f"node {task.node_id} is offline: nothing is left to stop"
    return list(
        decide_transition(
            task,
            S.STOPPED,
            actor=Actor.CONTROLLER,
            expected_status=S.STOPPING,
            reason_code=ReasonCode.NODE_LOST,
            reason=why,
            error=why,
        )
    )


# --- idle sleep ----------------------------------------------------------------------------


def serving_replicas(tasks: list[Task]) -> list[Task]:
    """A group's replicas: its members, plus any other live replica (during a rollout the old
    replica of a rank serves, and drains, beside its new-generation replacement)."""
    members = current_members(tasks)
    ids = {m.id for m in members}
    return members + [t for t in tasks if t.id not in ids and t.status not in TERMINAL]


@dataclass(frozen=True)
class Idleness:
    """What is known of one serving target's activity, in seconds before now.

    `busy`: a router holds a request for it (in flight or queued). `activity_s`: since the
    last request any router reported, or since a router began watching it when it has
    routed none (None: no router has reported it). `running_s`: since its newest running
    member became running (None: no member runs)."""

    idle_timeout_s: float
    busy: bool = False
    activity_s: float | None = None
    running_s: float | None = None

    @property
    def idle_s(self) -> float | None:
        """How long it has been idle: since the later of its last activity and its newest
        running member's start (None when no member runs)."""
        if self.running_s is None:
            return None
        if self.activity_s is None:
            return self.running_s
        return min(self.activity_s, self.running_s)


def decide_idle_sleep(view: Idleness) -> bool:
    """A serving target goes to sleep once idle for its timeout; a timeout of 0 never, a
    request in flight or queued at any router never."""
    if view.idle_timeout_s <= 0 or view.busy:
        return False
    idle = view.idle_s
    return idle is not None and idle >= view.idle_timeout_s


def sleep_idle(task: Task) -> list[Payload]:
    """Put one running member of an idle target to sleep (a CAS on `running`)."""
    return list(
        decide_transition(
            task,
            S.SLEEPING,
            actor=Actor.CONTROLLER,
            expected_status=S.RUNNING,
            reason_code=ReasonCode.IDLE_SLEEP,
        )
    )
