"""Queue admission (seed 004): the queue's remaining quota first, then its pools.

A task in a queue is admitted only while the queue's quota allows it (`check_queue`, a
task-level check before any node is looked at); the node stages then keep it on nodes of the
queue's pools (`check_pool`, a static node stage in feasibility.py). Both must hold, and the
"why pending" answer says which one did not: `queue_quota_exceeded`, or `not_in_pool` /
`pool_capacity`.

Counts use the GPU-holding set of SPEC §1, this round's reservations included (the ledger).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from .feasibility import EPS, floor_cost
from .model import Allocation, PendingTask, QueueLimits
from .reasons import PASS, Reason, Verdict, reject


@dataclass
class QueueUse:
    """What one queue holds now: cards, tasks, and tasks per job (a job runs while > 0)."""

    gpus: float = 0.0
    tasks: int = 0
    jobs: dict[str, int] = field(default_factory=dict)

    def add(self, alloc: Allocation, cost: float) -> None:
        self.gpus += cost
        self.tasks += 1
        self.jobs[alloc.job_key] = self.jobs.get(alloc.job_key, 0) + 1


def with_queues(
    pending: Sequence[PendingTask], queues: Mapping[str, QueueLimits]
) -> list[PendingTask]:
    """Each task with its queue's pools, priority and policy filled in."""
    out: list[PendingTask] = []
    for task in pending:
        limits = queues.get(task.queue) if task.queue else None
        if limits is None:
            out.append(task)
        else:
            out.append(
                replace(task, pools=limits.pools, queue_priority=limits.priority, fifo=limits.fifo)
            )
    return out


def check_queue(task: PendingTask, limits: QueueLimits | None, use: QueueUse | None) -> Verdict:
    """Whether the queue's remaining quota admits `task` (a task outside a queue passes)."""
    if not task.queue:
        return PASS
    if limits is None:
        return reject(
            Reason.QUEUE_QUOTA_EXCEEDED, f"queue {task.queue!r} is deleted: it admits no work"
        )
    use = use or QueueUse()
    name = task.queue
    if limits.max_running_tasks and use.tasks + 1 > limits.max_running_tasks:
        return reject(
            Reason.QUEUE_QUOTA_EXCEEDED,
            f"queue {name!r} max_running_tasks is {limits.max_running_tasks}: {use.tasks} running",
        )
    if (
        limits.max_running_jobs
        and task.job_key not in use.jobs
        and len(use.jobs) + 1 > limits.max_running_jobs
    ):
        return reject(
            Reason.QUEUE_QUOTA_EXCEEDED,
            f"queue {name!r} max_running_jobs is {limits.max_running_jobs}: "
            f"{len(use.jobs)} running",
        )
    cost = floor_cost(task)
    if limits.max_gpus and cost and use.gpus + cost > limits.max_gpus + EPS:
        return reject(
            Reason.QUEUE_QUOTA_EXCEEDED,
            f"queue {name!r} max_gpus is {limits.max_gpus}: {use.gpus:g} held, "
            f"this task needs {cost:g}",
        )
    return PASS


def pool_full(task: PendingTask, message: str) -> Verdict:
    """The queue admitted the task but the nodes of its pools have no room."""
    names = ", ".join(sorted(task.pools))
    return reject(Reason.POOL_CAPACITY, f"pool(s) {names} of queue {task.queue!r} full: {message}")
