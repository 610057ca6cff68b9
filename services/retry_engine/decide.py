"""The retry decision chain of SPEC §4, pure: a failed task and its evidence in, events out.

Order: device fault (the card's, not the task's: requeued at once without spending a retry,
`device_requeue`) → group member (static world or replica: the group owns it) → retries
exhausted → `no_retry` → classify → permanent / CPU OOM / GPU OOM / transient /
other-by-strategy. Every outcome is a
`task_retry_decided` event with its reason; a retry adds the one `failed → pending` transition
the retry engine alone may make, with the next attempt's memory and placement constraints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.task.decide import decide_transition
from libs.domain.task.events import TaskRetryDecided
from libs.domain.task.failure import (
    DeviceFault,
    DeviceVerdict,
    Failure,
    FailureClass,
    classify,
    classify_device,
)
from libs.domain.task.model import RetryStrategy, Task, TaskType
from libs.domain.task.states import Actor, TaskStatus


@dataclass(frozen=True)
class RetryConfig:
    """Global defaults (`scheduler.retry.*` of seed 003); tasks may override the last three."""

    retry_delay_s: float = 30.0
    backoff_multiplier: float = 2.0
    oom_memory_limit_mb: int = 16384


@dataclass(frozen=True)
class NodeFacts:
    """What the engine needs to know of a node to choose the next attempt's constraints."""

    online: bool
    memory_mb: int
    max_vram_mb: int
    vram_by_gpu: Mapping[str, int]


@dataclass(frozen=True)
class Evidence:
    exit_code: int | None
    oom_killed: bool
    error_kind: str
    error: str
    output: str
    failed_at: datetime
    device_log: str = ""  # kernel log lines the agent read (agent/device_log.py)
    xids: tuple[int, ...] = ()


# Device requeues of one task before its failures count as its own again: a task that
# brings down every card it touches is not a run of bad cards.
MAX_DEVICE_REQUEUES = 3


def device_fault(task: Task, ev: Evidence) -> DeviceFault:
    """The device verdict on a failure: whose fault, which card, and the evidence."""
    return classify_device(
        log="\n".join((ev.device_log, ev.error, ev.output)),
        xids=ev.xids,
        card=task.gpu_ids[0] if len(task.gpu_ids) == 1 else "",
    )


def cards_at_fault(task: Task, fault: DeviceFault) -> tuple[str, ...]:
    """The cards to quarantine for a device-fatal fault: the one the evidence names among
    the task's, else the task's only card, else (a PCI id we cannot map to a card) all of
    the task's cards; none for any other verdict or a task that held no card."""
    if fault.verdict is not DeviceVerdict.DEVICE_FATAL or not task.gpu_ids:
        return ()
    named = [g for g in task.gpu_ids if fault.card and (g == fault.card or fault.card in g)]
    return tuple(named) or tuple(task.gpu_ids)


def is_static_world_member(task: Task) -> bool:
    """Training and TP/PP group members: one rank cannot rejoin a formed rendezvous alone."""
    if task.group_id is None:
        return False
    return task.spec.platform.static_world or task.spec.task_type is TaskType.TRAINING


def backoff_delay(task: Task, cfg: RetryConfig) -> float:
    """retry_delay × backoff_multiplier^(n-1) for retry number n."""
    base = task.spec.retry_delay if task.spec.retry_delay is not None else cfg.retry_delay_s
    mult = (
        task.spec.backoff_multiplier
        if task.spec.backoff_multiplier is not None
        else cfg.backoff_multiplier
    )
    n = task.retry_count + 1
    return float(base * mult ** (n - 1))


def decide_retry(
    task: Task, ev: Evidence, cfg: RetryConfig, nodes: Mapping[str, NodeFacts]
) -> list[Payload]:
    """The decision's events; an app-caused (or spent) device fault is the user's failure,
    decided as any other, with the device verdict and its evidence on the decision."""
    fault = device_fault(task, ev)
    out = _decide(task, ev, cfg, nodes, fault)
    if fault.verdict is DeviceVerdict.UNKNOWN:
        return out
    return [
        e.model_copy(
            update={"device_verdict": fault.verdict.value, "device_evidence": fault.evidence}
        )
        if isinstance(e, TaskRetryDecided)
        else e
        for e in out
    ]


def _decide(
    task: Task,
    ev: Evidence,
    cfg: RetryConfig,
    nodes: Mapping[str, NodeFacts],
    fault: DeviceFault,
) -> list[Payload]:
    if task.status is not TaskStatus.FAILED:
        return []
    failure = classify(
        exit_code=ev.exit_code,
        oom_killed=ev.oom_killed,
        error_kind=ev.error_kind,
        error=ev.error,
        output=ev.output,
    )
    if fault.verdict is not DeviceVerdict.UNKNOWN:
        failure = Failure(failure.cls, failure.kind or fault.code, failure.evidence)
    if (
        cards_at_fault(task, fault)
        and task.group_id is None
        and task.requeues < MAX_DEVICE_REQUEUES
    ):
        return _requeue(task, fault)
    if is_static_world_member(task):
        return [
            _decided(
                task,
                failure,
                "hold",
                "static-world group member: left failed for the group to handle",
            )
        ]
    if task.group_id is not None:
        # Replica groups replace the failed rank with a new task (seed 000, layer 4).
        return [_decided(task, failure, "hold", "group member: the group replaces it")]
    if task.retry_count >= task.spec.max_retries:
        return [
            _decided(
                task,
                failure,
                "give_up",
                f"retries exhausted ({task.retry_count}/{task.spec.max_retries})",
            )
        ]
    if task.spec.retry_strategy is RetryStrategy.NO_RETRY:
        return [_decided(task, failure, "give_up", "retry_strategy is no_retry")]
    plan = _plan(task, failure, cfg, nodes)
    if isinstance(plan, str):
        return [_decided(task, failure, "give_up", plan)]
    delay = backoff_delay(task, cfg)
    reason = plan.pop("why")
    memory = plan.get("memory_mb")
    decided = _decided(
        task,
        failure,
        "retry",
        f"{reason}; retry {task.retry_count + 1}/{task.spec.max_retries} after {delay:g}s",
        delay,
        memory,
    )
    move = decide_transition(
        task,
        TaskStatus.PENDING,
        actor=Actor.RETRY_ENGINE,
        expected_status=TaskStatus.FAILED,
        reason_code=ReasonCode.RETRY,
        reason=decided.reason,
        retry_count=task.retry_count + 1,
        clear_placement=True,
        not_before=ev.failed_at + timedelta(seconds=delay),
        **plan,
    )
    return [decided, *move]


def _requeue(task: Task, fault: DeviceFault) -> list[Payload]:
    """Slurm's expedited requeue: at once, no back-off, retry_count unchanged."""
    reason = (
        f"device fault on {', '.join(cards_at_fault(task, fault))} ({fault.code}): "
        f"{fault.evidence}; requeued at once without spending a retry "
        f"(device requeue {task.requeues + 1}/{MAX_DEVICE_REQUEUES})"
    )
    decided = TaskRetryDecided(
        task_id=task.id,
        attempt=task.retry_count,
        node_id=task.node_id,
        failure_class=fault.verdict.value,
        failure_kind=fault.code,
        action="requeue",
        reason=reason,
        device_verdict=fault.verdict.value,
        device_evidence=fault.evidence,
    )
    move = decide_transition(
        task,
        TaskStatus.PENDING,
        actor=Actor.RETRY_ENGINE,
        expected_status=TaskStatus.FAILED,
        reason_code=ReasonCode.DEVICE_REQUEUE,
        reason=reason,
        requeues=task.requeues + 1,
        clear_placement=True,
        not_before=None,
        min_vram_mb=task.min_vram_mb or None,
    )
    return [decided, *move]


def _plan(
    task: Task, failure: Failure, cfg: RetryConfig, nodes: Mapping[str, NodeFacts]
) -> dict[str, Any] | str:
    """Constraints for the next attempt, or the reason there is none (a permanent failure)."""
    failed_on = task.node_id or ""
    here = nodes.get(failed_on)
    if failure.cls is FailureClass.PERMANENT:
        return f"permanent failure ({failure.kind}): {failure.evidence}; not retried"
    if failure.cls is FailureClass.CPU_OOM:
        limit = task.spec.oom_memory_limit or cfg.oom_memory_limit_mb
        doubled = task.spec.memory_mb * 2
        if doubled > limit:
            return (
                f"OOM-killed at {task.spec.memory_mb} MB; doubling to {doubled} MB exceeds "
                f"oom_memory_limit {limit} MB: permanent failure"
            )
        same = failed_on if here and here.online and here.memory_mb >= doubled else ""
        return {
            "why": f"OOM-killed at {task.spec.memory_mb} MB: memory doubled to {doubled} MB",
            "memory_mb": doubled,
            "same_node_id": same or None,
        }
    if failure.cls is FailureClass.GPU_OOM:
        vram = max((here.vram_by_gpu.get(g, 0) for g in task.gpu_ids), default=0) if here else 0
        bigger = [n for n, f in nodes.items() if f.online and f.max_vram_mb > vram]
        # A later variant (docs/scheduling.md#variants) may run without a bigger card (CPU).
        later = task.variant is not None and task.variant + 1 < len(task.spec.variants)
        if not bigger and not later:
            return (
                f"GPU out of memory on a {vram} MB card and no online node has a card with "
                "more VRAM: permanent failure"
            )
        moved = (
            f"; the variants after variants[{task.variant}] are considered at once" if later else ""
        )
        return {
            "why": f"GPU out of memory on a {vram} MB card: needs more than {vram} MB{moved}",
            "min_vram_mb": vram + 1,
        }
    if failure.cls is FailureClass.TRANSIENT:
        return {
            "why": f"transient failure ({failure.kind}): same node",
            "same_node_id": failed_on or None,
        }
    if task.spec.retry_strategy is RetryStrategy.RETRY_SAME_NODE:
        return {"why": f"{failure.evidence}: retry_same_node", "same_node_id": failed_on or None}
    others = [n for n, f in nodes.items() if f.online and n != failed_on]
    avoid = (failed_on,) if failed_on and others else None
    where = "another node" if avoid else "any node (no other node is online)"
    return {"why": f"{failure.evidence}: retry_new_node on {where}", "avoid_node_ids": avoid}


def _decided(
    task: Task,
    failure: Failure,
    action: str,
    reason: str,
    delay: float = 0.0,
    memory: int | None = None,
) -> TaskRetryDecided:
    return TaskRetryDecided(
        task_id=task.id,
        attempt=task.retry_count,
        node_id=task.node_id,
        failure_class=failure.cls.value,
        failure_kind=failure.kind,
        action=action,
        reason=reason,
        delay_s=delay,
        memory_mb=memory,
    )
