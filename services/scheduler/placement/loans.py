"""Card lending, the scheduler's part (pure): which pending training tasks run on the cards of
a sleeping task of their tenant (seed 000; libs/domain/task/lending.py has the events).

Asked after a round's plan, for the tasks the plan left waiting for cards (or for quota: a
borrowed card is already counted, on its lender). A borrower must be a training task of the
lender's tenant, want whole cards (no more than the lender holds, of the type it names), not
be a member of a gang or of a queue, and fit the lender's node in every other respect (pin,
exclusions, runtime, memory, CPU, anti-affinity, starts in flight). A lender is a sleeping
task whose whole cards were measured free (`lending.lendable`); it lends to one borrower at a
time. Lenders are taken in (node, task id) order, borrowers in the plan's order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from libs.domain.task.lending import may_borrow
from libs.domain.task.model import TaskType
from libs.domain.task.states import TaskStatus

from .feasibility import usage_of
from .model import Allocation, ClusterSnapshot, Gpu, Node, PendingTask, Plan, gpu_matches
from .planner import gpu_label
from .reasons import Reason
from .stages import LATE_STAGES, check_static

# The plan's answers that a lent card can cure: no free card, or no quota left for one.
BORROWABLE: frozenset[Reason] = frozenset({Reason.INSUFFICIENT_GPUS, Reason.TENANT_QUOTA_EXCEEDED})


@dataclass(frozen=True, slots=True)
class Loan:
    borrower_task_id: str
    lender_task_id: str
    node_id: str
    gpu_ids: tuple[str, ...]
    gpu_label: str = ""
    borrower_tenant_id: str = ""  # checked against the lender's when the loan commits


def plan_loans(
    snapshot: ClusterSnapshot, pending: Sequence[PendingTask], plan: Plan
) -> tuple[Loan, ...]:
    """Loans for the tasks `plan` left waiting for cards, in `pending`'s order."""
    waiting = {u.task_id for u in plan.unplaced if u.reason in BORROWABLE}
    borrowers = [t for t in pending if t.task_id in waiting and _may_borrow_at_all(t)]
    lenders = sorted(
        (a for a in snapshot.allocations if a.lendable and a.status is TaskStatus.SLEEPING),
        key=lambda a: (a.node_id, a.task_id),
    )
    if not borrowers or not lenders:
        return ()
    nodes = {n.id: n for n in snapshot.nodes}
    held = _held(snapshot, pending, plan)
    loans: list[Loan] = []
    for task in borrowers:
        for lender in lenders:
            node = nodes.get(lender.node_id)
            if node is None or not _fits(task, lender, node, held.get(node.id, [])):
                continue
            cards = _cards(task, lender, node)
            loans.append(
                Loan(
                    task.task_id,
                    lender.task_id,
                    node.id,
                    cards,
                    gpu_label(node.gpus, cards),
                    borrower_tenant_id=task.tenant_id,
                )
            )
            held.setdefault(node.id, []).append(_as_allocation(task, node.id, cards))
            lenders.remove(lender)
            break
    return tuple(loans)


def _may_borrow_at_all(task: PendingTask) -> bool:
    req = task.requirement
    return (
        req.gpu_count > 0
        and task.gang_id is None
        and not task.queue
        and task.task_type == TaskType.TRAINING.value
    )


def _fits(task: PendingTask, lender: Allocation, node: Node, held: list[Allocation]) -> bool:
    if not may_borrow(task.task_type, task.tenant_id, lender.tenant_id):
        return False
    if len(_lent_cards(task, lender, node)) < task.requirement.gpu_count:
        return False
    if not check_static(task, node).ok:
        return False
    usage = usage_of(held)
    return all(stage(task, node, usage).ok for stage in LATE_STAGES)


def _lent_cards(task: PendingTask, lender: Allocation, node: Node) -> tuple[Gpu, ...]:
    """The lender's cards the task could use: of its type, big enough, not lost."""
    by_id = {g.id: g for g in node.gpus}
    req = task.requirement
    return tuple(
        g
        for gid in lender.gpu_ids
        if (g := by_id.get(gid)) is not None
        and not g.excluded
        and gpu_matches(g, req.gpu_type)
        and g.vram_mb > task.required_min_vram_mb
    )


def _cards(task: PendingTask, lender: Allocation, node: Node) -> tuple[str, ...]:
    return tuple(g.id for g in _lent_cards(task, lender, node)[: task.requirement.gpu_count])


def _held(
    snapshot: ClusterSnapshot, pending: Sequence[PendingTask], plan: Plan
) -> dict[str, list[Allocation]]:
    """What each node holds once the plan's placements are made."""
    out: dict[str, list[Allocation]] = {}
    for a in snapshot.allocations:
        if a.holding:
            out.setdefault(a.node_id, []).append(a)
    by_id = {t.task_id: t for t in pending}
    for p in plan.placements:
        if (t := by_id.get(p.task_id)) is not None:
            out.setdefault(p.node_id, []).append(_as_allocation(t, p.node_id, p.gpu_ids))
    return out


def _as_allocation(task: PendingTask, node_id: str, cards: tuple[str, ...]) -> Allocation:
    req = task.requirement
    return replace(
        Allocation(task.task_id, task.tenant_id, node_id, TaskStatus.SCHEDULED, gpu_ids=cards),
        memory_mb=req.memory_mb,
        cpu_cores=req.cpu_cores,
        anti_affinity=req.anti_affinity,
    )
