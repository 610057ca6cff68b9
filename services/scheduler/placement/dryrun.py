"""A dry run: what the next evaluation would do with new work, node by node, writing nothing.

The plan endpoints (docs/scheduling.md, "Plan and ETA") hand this a snapshot read from the
projections and the submission as `PendingTask`s. The answer is the planner's own `Plan` for
them (placements, preemptions, why not), the admission each task meets (its queue's and its
tenant's quota) and, per task, every node with the verdict of the stage chain: the stage that
refused it (its name in `stages.STAGES`) or, for a node that fits, its scores. The work
already pending is not replayed ahead of the submission: its place in line is the `position`
of the "why pending" answer (eta.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from .feasibility import check_quota_floor
from .ledger import Ledger
from .model import ClusterSnapshot, PendingTask, Plan
from .planner import Evaluation, Planner
from .queues import QueueUse, check_queue, with_queues
from .rankers import named, ranked
from .reasons import Reason, Verdict
from .stages import NODE_STAGE_ORDER, STAGES, check_node
from .variants import as_variant

# The stage that answers each reason: the chain's own names, plus the task-level checks that
# run before any node is looked at (planner.schedule_task) and what the planner adds.
STAGE_OF: Mapping[Reason, str] = {
    **{s.reason: s.name for s in STAGES},
    Reason.BACKOFF: "backoff",
    Reason.QUEUE_QUOTA_EXCEEDED: "queue_quota",
    Reason.POOL_CAPACITY: "pool_capacity",
    Reason.NO_NODES: "cluster",
    Reason.PORT_TAKEN: "ports",
    Reason.GANG_INCOMPLETE: "gang",
    Reason.LOOPBACK_ADDRESS: "gang",
}
_RANK: Mapping[Reason, int] = {r: i for i, r in enumerate(NODE_STAGE_ORDER)}


def variant_opens(task: PendingTask, pos: int) -> datetime:
    """When the variant at `pos` joins those considered (variants.open_variants): once the
    waits of every earlier one have run out, each counted from submission."""
    waits = [v.wait_s for v in task.variants[:pos] if v.index > task.variant_floor]
    return task.created_at + timedelta(seconds=max(waits, default=0.0))


def stage_of(reason: Reason | None) -> str:
    """The stage name of a reason ("" for none; the reason's own value for any other)."""
    if reason is None:
        return ""
    return STAGE_OF.get(reason, reason.value)


@dataclass(frozen=True, slots=True)
class NodeAnswer:
    """One node against one task: it fits (with its scores and cards) or a stage refused it."""

    node_id: str
    fits: bool
    stage: str = ""
    reason: Reason | None = None
    message: str = ""
    gpu_ids: tuple[str, ...] = ()
    scores: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Admission:
    """The queue and quota a task is admitted under, and whether they admit it now."""

    queue: str
    queue_limits: Mapping[str, float]
    queue_used: Mapping[str, float]
    tenant_quota: float  # cards; 0 = unlimited
    tenant_used: float
    verdict: Verdict


@dataclass(frozen=True, slots=True)
class VariantRun:
    """One of a task's variants: from when it is considered, and its nodes."""

    index: int
    considered_from: datetime
    nodes: tuple[NodeAnswer, ...]


@dataclass(frozen=True, slots=True)
class TaskRun:
    task: PendingTask
    admission: Admission
    # Fits first, best first; then the closest refusals. A task with variants: those of the
    # variant the plan places, else of its first (each variant's are in `variants`).
    nodes: tuple[NodeAnswer, ...]
    variants: tuple[VariantRun, ...] = ()


@dataclass(frozen=True, slots=True)
class DryRun:
    plan: Plan
    tasks: tuple[TaskRun, ...]


def dry_run(snapshot: ClusterSnapshot, submitted: Sequence[PendingTask]) -> DryRun:
    """The planner on `submitted` alone against `snapshot`, and every node's verdict."""
    queued = with_queues(submitted, snapshot.queues)
    result = Planner().plan(snapshot, queued, max_batch=max(1, len(queued)))
    ev = Evaluation.of(snapshot, None)
    ledger = Ledger(ev.index, snapshot.allocations, ev.gpus)
    runs = tuple(_run(ev, ledger, result, task) for task in queued)
    return DryRun(result, runs)


def _run(ev: Evaluation, ledger: Ledger, result: Plan, task: PendingTask) -> TaskRun:
    if not task.variants:
        return TaskRun(task, admission(ev, ledger, task), node_answers(ev, ledger, task))
    each = tuple(
        VariantRun(v.index, variant_opens(task, pos), node_answers(ev, ledger, as_variant(task, v)))
        for pos, v in enumerate(task.variants)
    )
    placed = result.placement_for(task.task_id)
    chosen = next((r for r in each if placed and r.index == placed.variant), each[0])
    first = as_variant(task, task.variants[0])
    return TaskRun(task, admission(ev, ledger, first), chosen.nodes, each)


def admission(ev: Evaluation, ledger: Ledger, task: PendingTask) -> Admission:
    quota = ev.quota(ledger, task.tenant_id, task.surge_cards)
    limits = ev.snapshot.queues.get(task.queue) if task.queue else None
    use = ledger.queue_use.get(task.queue) or QueueUse()
    verdict = check_quota_floor(task, quota)
    if verdict.ok:
        verdict = check_queue(task, limits, use)
    return Admission(
        queue=task.queue,
        queue_limits=(
            {
                "max_gpus": limits.max_gpus,
                "max_running_tasks": limits.max_running_tasks,
                "max_running_jobs": limits.max_running_jobs,
                "priority": limits.priority,
            }
            if limits
            else {}
        ),
        queue_used=(
            {"gpus": use.gpus, "tasks": use.tasks, "jobs": len(use.jobs)} if task.queue else {}
        ),
        tenant_quota=ev.snapshot.quota_of(task.tenant_id),
        tenant_used=ledger.tenant_used.get(task.tenant_id, 0.0),
        verdict=verdict,
    )


def node_answers(ev: Evaluation, ledger: Ledger, task: PendingTask) -> tuple[NodeAnswer, ...]:
    """Every node checked by the stage chain (`check_node`, the planner's own check)."""
    quota = ev.quota(ledger, task.tenant_id, task.surge_cards)
    fits = []
    refused: list[tuple[int, NodeAnswer]] = []
    for node in ev.nodes:
        verdict, fit = check_node(task, node, ledger.usage_on(node.id), quota=quota)
        if fit is not None:
            fits.append(fit)
            continue
        reason = verdict.reason
        answer = NodeAnswer(node.id, False, stage_of(reason), reason, verdict.message)
        refused.append((_RANK.get(reason, -1) if reason else -1, answer))
    best = [
        NodeAnswer(f.node.id, True, gpu_ids=f.grant.gpu_ids, scores=named(s))
        for s, f in ranked(fits, task)
    ]
    # The closest refusals first: the furthest a node got through the chain (planner.explain).
    refused.sort(key=lambda r: (-r[0], r[1].node_id))
    return (*best, *(a for _, a in refused))
