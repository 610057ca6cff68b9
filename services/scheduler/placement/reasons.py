"""Why a task is not placed: one named reason per rejection.

The reasons are codes of the platform's one enum, `libs.domain.reasons.ReasonCode` (the
"why pending" part, `PLACEMENT_REASONS`), so the same value is the `task_pending_reason`
event's code, the task's `pending_reason_code` and the `reason` label of scheduling metrics.
Every feasibility stage answers with a `Verdict`: `ok`, and when not ok the reason plus a
message a user can act on.
"""

from __future__ import annotations

from dataclasses import dataclass

from libs.domain.reasons import PLACEMENT_REASONS, ReasonCode

# The scheduler's name for the enum; its stages only ever answer a PLACEMENT_REASONS code.
Reason = ReasonCode

__all__ = ["CAPACITY_REASONS", "PASS", "PLACEMENT_REASONS", "Reason", "Verdict", "reject"]


# Reasons that describe capacity taken by other work, the only ones preemption can cure.
CAPACITY_REASONS: frozenset[Reason] = frozenset(
    {
        Reason.INSUFFICIENT_GPUS,
        Reason.FRACTION_UNAVAILABLE,
        Reason.INSUFFICIENT_MEMORY,
        Reason.INSUFFICIENT_CPU,
        Reason.ANTI_AFFINITY,
        Reason.POOL_CAPACITY,  # the same, inside the queue's pools
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
