"""Tasks their node no longer confirms: the bounded wait before the platform gives up on them.

Every heartbeat lists the tasks the agent tracks. A task in a status that needs its node
(`SWEPT`) that its node has not listed for `after_s` — counted from its last confirmation,
or from when the sweep first met it in this status and placement, whichever is later — is
overdue: the node monitor resolves it as a lost node would (monitor.ON_NODE_LOSS), with
`ReasonCode.TASK_UNCONFIRMED`. So no task waits for a report that will never come, whatever
was lost on the way (a refused report, a start command the agent never saw).

The clocks live in the lease holder's memory, like heartbeat liveness: a new leader starts
them all afresh, so a failover delays a resolution by at most `after_s`, never hastens one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from libs.domain.task.states import TaskStatus

S = TaskStatus

# Statuses that wait on the node (not `pending`, not terminal; `sleeping` holds no container).
SWEPT: frozenset[TaskStatus] = frozenset(
    {S.SCHEDULED, S.STARTING, S.RUNNING, S.WAKING, S.STOPPING, S.DRAINING, S.PREEMPTING}
)
Placement = tuple[str, str, TaskStatus]  # task id, node id ("" = none), status


@dataclass
class Confirmations:
    after_s: float
    confirmed: dict[tuple[str, str], float] = field(default_factory=dict)  # (task, node)
    met: dict[Placement, float] = field(default_factory=dict)

    def confirm(self, node_id: str, task_ids: Iterable[str], now: float) -> None:
        """A heartbeat of `node_id` listed these tasks at `now`."""
        for task_id in task_ids:
            self.confirmed[(task_id, node_id)] = now

    def reset(self) -> None:
        self.confirmed.clear()
        self.met.clear()

    def strays(
        self, placed: Sequence[Placement], now: float, within_s: float
    ) -> list[tuple[str, str]]:
        """(task, node) of the tasks a node other than theirs listed within `within_s`: what
        that node still runs for them is a stray (an agent back after its tasks moved)."""
        where = {task: node for task, node, _ in placed}
        return [
            (task, node)
            for (task, node), at in self.confirmed.items()
            if task in where and where[task] not in ("", node) and now - at <= within_s
        ]

    def overdue(self, placed: Sequence[Placement], now: float) -> list[Placement]:
        """The placements unconfirmed for longer than `after_s`; forgets what left `placed`."""
        current = set(placed)
        self.met = {p: t for p, t in self.met.items() if p in current}
        for p in placed:
            self.met.setdefault(p, now)
        live = {(task, node) for task, node, _ in placed}
        self.confirmed = {k: t for k, t in self.confirmed.items() if k in live}
        late = []
        for p in placed:
            task, node, _ = p
            since = max(self.met[p], self.confirmed.get((task, node), self.met[p]))
            if now - since > self.after_s:
                late.append(p)
        return late
