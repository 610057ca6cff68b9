"""Variant selection (docs/scheduling.md#variants), pure: which of a task's variants are
considered at a given time, and how their refusals read.

A task's variants are tried in order; the first one that fits is placed. Variant `i + 1`
joins the ones considered once the waits of variants `0..i` have all run out, each wait
counted from the task's submission (`created_at`); the earlier ones stay considered (a
preferred card that frees up later is still taken), and the last one is waited for for
ever. A GPU OOM retry of variant `v` (`PendingTask.variant_floor`) counts the waits of
`0..v` as run out: it moves on at once.

The planner (planner.py: `schedule_variants`, `place_gang_variants`) does the trying;
`open_variants` is the selection itself, for any caller that wants to know which variants a
task would be tried with now and when the next one opens. Members of one group run one
variant: `pin_to_group` holds a member to the variant its group already runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from .model import PendingTask, Unplaced, Variant


@dataclass(frozen=True, slots=True)
class Opening:
    """The variants considered at `now` (in order) and the next one with when it joins
    them (None: every variant is considered)."""

    considered: tuple[Variant, ...]
    next_variant: Variant | None = None
    opens_at: datetime | None = None


def open_variants(task: PendingTask, now: datetime) -> Opening:
    """The selection of `task`'s variants at `now` (module docstring); no variants: none."""
    considered: list[Variant] = []
    last = len(task.variants) - 1
    for pos, var in enumerate(task.variants):
        considered.append(var)
        if pos >= last or var.index <= task.variant_floor:
            continue
        deadline = task.created_at + timedelta(seconds=var.wait_s)
        if now < deadline:
            return Opening(tuple(considered), task.variants[pos + 1], deadline)
    return Opening(tuple(considered))


def pin_to_group(task: PendingTask, group_variants: Mapping[str, int]) -> PendingTask:
    """`task` restricted to the variant its group's members run (every member of a group
    runs the same one): `task.variant_pin`, else what a member placed earlier in this
    evaluation got (`group_variants`, by `variant_group`). Unpinned: `task` as it is."""
    pin = task.variant_pin
    if pin is None and task.variant_group:
        pin = group_variants.get(task.variant_group)
    if pin is None or not task.variants:
        return task
    return replace(task, variants=tuple(v for v in task.variants if v.index == pin))


def as_variant(task: PendingTask, var: Variant) -> PendingTask:
    """`task` asking for `var`'s requirement only (what the planner checks per variant)."""
    return replace(task, requirement=var.requirement, variants=(), variant_floor=-1)


def refused(task_id: str, tried: Sequence[tuple[Variant, Unplaced]], opening: Opening) -> Unplaced:
    """One "why pending" for every variant tried, in order, each with its own reason, and
    when the next one is considered. Its code is the first variant's (the preferred one)."""
    assert tried, "at least one variant is always considered"
    parts = [
        f"variants[{var.index}] ({var.label}): {why.reason.value}: {why.message}"
        for var, why in tried
    ]
    if opening.next_variant is not None and opening.opens_at is not None:
        nxt = opening.next_variant
        parts.append(
            f"variants[{nxt.index}] ({nxt.label}) considered from "
            f"{opening.opens_at.isoformat()} (after variants[{nxt.index - 1}].wait_s)"
        )
    return Unplaced(task_id, tried[0][1].reason, "; ".join(parts))
