"""Ranking: among the nodes that fit, which one gets the task.

Bin-pack: prefer the node left with the fewest free whole GPUs, then (for fractions) the
fullest card, then the least free memory, so large requests keep finding empty nodes.
Ties are broken by a shuffle seeded with the task id (`random.Random(task_id)`): the same
snapshot and task always give the same answer, so a decision can be replayed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TypeVar

from .feasibility import CardUse, Fit, fill_after, free_whole_cards
from .model import PendingTask

T = TypeVar("T")

Score = tuple[int, float, int]


def score(fit: Fit, task: PendingTask) -> Score:
    """Lower is better: (free whole GPUs after, room left on the shared card, free memory)."""
    usage, node, grant = fit.usage, fit.node, fit.grant
    taken_empty = sum(1 for gid in grant.gpu_ids if gid not in usage.cards)
    free_after = free_whole_cards(node, usage) - taken_empty
    room = 0.0
    if grant.fractions:
        share = grant.fractions[0]
        gpu = next(g for g in node.gpus if g.id == share.gpu_id)
        room = 1.0 - fill_after(gpu, usage.cards.get(gpu.id, CardUse()), share)
    free_memory = node.memory_mb - usage.memory_mb - task.requirement.memory_mb
    return (free_after, room, free_memory)


def seeded_shuffle(items: Sequence[T], seed: str, key: Callable[[T], str]) -> list[T]:
    """Shuffle deterministically: sort by `key` first so the input order does not matter."""
    out = sorted(items, key=key)
    random.Random(seed).shuffle(out)
    return out


def rank(fits: Sequence[Fit], task: PendingTask) -> list[Fit]:
    """Best first; equal scores keep their seeded-shuffle order."""
    shuffled = seeded_shuffle(fits, task.task_id, key=lambda f: f.node.id)
    return sorted(shuffled, key=lambda f: score(f, task))
