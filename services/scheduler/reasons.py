"""Why a task is not placed: one named reason per rejection.

`Reason` is shared by the scheduler's events, the task's "why pending" text and the
`reason` label of scheduling metrics, so its values are stable, lowercase identifiers.
Every feasibility stage answers with a `Verdict`: `ok`, and when not ok the reason plus a
message a user can act on.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Reason(StrEnum):
    # Task-level: decided before any node is looked at.
    NO_NODES = "no_nodes"
    BACKOFF = "backoff"
    TENANT_QUOTA_EXCEEDED = "tenant_quota_exceeded"
    GANG_INCOMPLETE = "gang_incomplete"
    # Node-level, in the order the stages run (see feasibility.NODE_STAGE_ORDER).
    PINNED_ELSEWHERE = "pinned_elsewhere"
    NODE_OFFLINE = "node_offline"
    NODE_EXCLUDED = "node_excluded"
    GPU_TYPE_UNAVAILABLE = "gpu_type_unavailable"
    INSUFFICIENT_VRAM = "insufficient_vram"
    INSUFFICIENT_GPUS = "insufficient_gpus"
    FRACTION_UNAVAILABLE = "fraction_unavailable"
    INSUFFICIENT_MEMORY = "insufficient_memory"
    INSUFFICIENT_CPU = "insufficient_cpu"
    ANTI_AFFINITY = "anti_affinity"


# Reasons that describe capacity taken by other work, the only ones preemption can cure.
CAPACITY_REASONS: frozenset[Reason] = frozenset(
    {
        Reason.INSUFFICIENT_GPUS,
        Reason.FRACTION_UNAVAILABLE,
        Reason.INSUFFICIENT_MEMORY,
        Reason.INSUFFICIENT_CPU,
        Reason.ANTI_AFFINITY,
    }
)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer of one feasibility stage: (ok, reason) plus a human-readable message."""

    ok: bool
    reason: Reason | None = None
    message: str = ""


PASS = Verdict(ok=True)


def reject(reason: Reason, message: str) -> Verdict:
    return Verdict(ok=False, reason=reason, message=message)
