"""What a pending task waits for, as eta.py replays it: the resource its reason names, what
is free of it now, the placed tasks whose ends free it, and what the task and the work ahead
of it need (docs/scheduling.md, "Plan and ETA").

* capacity (cards, memory or CPU by the reason) on the nodes that can take the task at all
  (those that pass the static stages, `check_static`): summed over them, not packed; when the
  sum would do but no node has room (fragmentation), the node that lacks the least;
* the tenant's GPU quota: its placed tasks and its tasks ahead;
* the queue's `max_gpus` or `max_running_tasks`: the queue's; `max_running_jobs` and a
  deleted queue hold nothing that a task's end frees.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .feasibility import allocation_cost, floor_cost, free_whole_cards
from .ledger import Ledger
from .model import Allocation, Node, PendingTask
from .planner import Evaluation
from .reasons import Reason
from .stages import check_static


@dataclass(frozen=True, slots=True)
class Need:
    """A resource the task waits for: what is free now, what it and the work ahead of it
    need (in order), and the placed tasks whose ends free it."""

    what: str
    weight: Callable[[Allocation], float]
    holders: tuple[Allocation, ...]
    free: float
    own: float
    ahead: tuple[tuple[str, float], ...] = ()


def _eligible(ev: Evaluation, task: PendingTask) -> list[Node]:
    return [n for n in ev.nodes if check_static(task, n).ok]


def capacity(
    ev: Evaluation,
    ledger: Ledger,
    task: PendingTask,
    ahead: Sequence[PendingTask],
    reason: Reason | None,
) -> Need | None:
    nodes = _eligible(ev, task)
    if not nodes:
        return None
    ids = {n.id for n in nodes}
    competing = [t for t in ahead if any(check_static(t, n).ok for n in nodes)]
    holders = tuple(a for nid in sorted(ids) for a in ledger.on(nid))
    unit, demand, weight, free_on = _dimension(ev, ledger, reason)
    free = sum(free_on(n) for n in nodes)
    own = demand(task)
    need = own + sum(demand(t) for t in competing)
    what = (
        f"{need:g} {unit} needed on the {len(nodes)} node(s) that can take it "
        f"({len(competing)} task(s) ahead), {free:g} free"
    )
    if need <= free and reason is not None:
        # Enough in sum but on no one node: the node that lacks the least must free it.
        node = min(nodes, key=lambda n: (own - free_on(n), n.id))
        return Need(
            f"{what}, split across nodes: node {node.id!r} must free {own - free_on(node):g}",
            weight,
            ledger.on(node.id),
            free_on(node),
            own,
        )
    ahead_of = tuple((t.task_id, demand(t)) for t in competing)
    return Need(what, weight, holders, free, own, ahead_of)


Dimension = tuple[
    str,
    Callable[[PendingTask], float],
    Callable[[Allocation], float],
    Callable[[Node], float],
]


def _dimension(ev: Evaluation, ledger: Ledger, reason: Reason | None) -> Dimension:
    """(unit, what a task needs, what a holder frees, what a node has free) for `reason`."""
    if reason is Reason.INSUFFICIENT_MEMORY:
        return (
            "MB of memory",
            lambda t: float(t.requirement.memory_mb),
            lambda a: float(a.memory_mb),
            lambda n: float(n.memory_mb - ledger.usage_on(n.id).memory_mb),
        )
    if reason is Reason.INSUFFICIENT_CPU:
        return (
            "CPU cores",
            lambda t: t.requirement.cpu_cores,
            lambda a: a.cpu_cores,
            lambda n: n.cpu_cores - ledger.usage_on(n.id).cpu_cores,
        )
    return (
        "card(s)",
        floor_cost,
        lambda a: allocation_cost(a, ev.gpus),
        lambda n: float(free_whole_cards(n, ledger.usage_on(n.id))),
    )


def tenant(ev: Evaluation, ledger: Ledger, task: PendingTask, ahead: Sequence[PendingTask]) -> Need:
    limit = ev.snapshot.quota_of(task.tenant_id)
    used = ledger.tenant_used.get(task.tenant_id, 0.0)
    mine = [t for t in ahead if t.tenant_id == task.tenant_id]
    need = floor_cost(task) + sum(floor_cost(t) for t in mine)
    holders = tuple(a for a in ev.snapshot.allocations if a.tenant_id == task.tenant_id)
    what = (
        f"tenant {task.tenant_id!r} GPU quota {limit:g}: {used:g} held, {need:g} needed "
        f"({len(mine)} of its task(s) ahead)"
    )
    ahead_of = tuple((t.task_id, floor_cost(t)) for t in mine)
    cost = lambda a: allocation_cost(a, ev.gpus)  # noqa: E731
    return Need(what, cost, holders, limit - used, floor_cost(task), ahead_of)


def queue(
    ev: Evaluation, ledger: Ledger, task: PendingTask, ahead: Sequence[PendingTask]
) -> list[Need]:
    limits = ev.snapshot.queues.get(task.queue)
    if limits is None:
        return [Need(f"queue {task.queue!r} is deleted", _one, (), 0.0, 1.0)]
    use = ledger.queue_use.get(task.queue)
    holders = tuple(a for a in ev.snapshot.allocations if a.queue == task.queue and a.holding)
    mine = [t for t in ahead if t.queue == task.queue]
    name = f"queue {task.queue!r}"
    out: list[Need] = []
    if limits.max_gpus:
        used = use.gpus if use else 0.0
        need = floor_cost(task) + sum(floor_cost(t) for t in mine)
        out.append(
            Need(
                f"{name} max_gpus {limits.max_gpus}: {used:g} held, {need:g} needed",
                lambda a: allocation_cost(a, ev.gpus),
                holders,
                limits.max_gpus - used,
                floor_cost(task),
                tuple((t.task_id, floor_cost(t)) for t in mine),
            )
        )
    if limits.max_running_tasks:
        tasks = use.tasks if use else 0
        out.append(
            Need(
                f"{name} max_running_tasks {limits.max_running_tasks}: {tasks} running, "
                f"{len(mine)} ahead",
                _one,
                holders,
                float(limits.max_running_tasks - tasks),
                1.0,
                tuple((t.task_id, 1.0) for t in mine),
            )
        )
    if limits.max_running_jobs and not out:
        # A job ends with its last task, which may not exist yet: no task's end bounds it.
        what = f"{name} max_running_jobs {limits.max_running_jobs}: a job ends with its last task"
        out.append(Need(what, _one, (), 0.0, 1.0))
    return out


def _one(a: Allocation) -> float:
    return 1.0
