"""Ranking: among the nodes that fit, which one gets the task.

The rankers are registered objects (`RANKERS`, in order), each giving a fit a named score,
lower is better; fits are compared on the scores in that order (the first decides, the next
breaks its ties). Bin-pack: prefer the node left with the fewest free whole GPUs
(`free_cards_after`), then for fractions the fullest card (`card_room_after`), then the least
free memory (`free_memory_mb_after`), so large requests keep finding empty nodes. The chosen
node's named scores are recorded on its placement (`Placement.scores`, the placement event's
`scores`), so "why this node" can be answered from the event.

Ties are broken by a shuffle seeded with the task id (`random.Random(task_id)`): the same
snapshot and task always give the same answer, so a decision can be replayed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from .feasibility import CardUse, Fit, fill_after, free_whole_cards
from .model import PendingTask

T = TypeVar("T")

Score = tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Ranker:
    """One named score of a fit; lower is better."""

    name: str
    score: Callable[[Fit, PendingTask], float]


def free_cards_after(fit: Fit, task: PendingTask) -> float:
    """Free whole cards the node keeps once the grant is taken."""
    usage, grant = fit.usage, fit.grant
    taken_empty = sum(1 for gid in grant.gpu_ids if gid not in usage.cards)
    return free_whole_cards(fit.node, usage) - taken_empty


def card_room_after(fit: Fit, task: PendingTask) -> float:
    """Room left on the shared card of a fraction (0 for whole cards)."""
    grant = fit.grant
    if not grant.fractions:
        return 0.0
    share = grant.fractions[0]
    gpu = next(g for g in fit.node.gpus if g.id == share.gpu_id)
    return 1.0 - fill_after(gpu, fit.usage.cards.get(gpu.id, CardUse()), share)


def free_memory_after(fit: Fit, task: PendingTask) -> float:
    """Memory (MB) the node has free once the task's is taken."""
    return fit.node.memory_mb - fit.usage.memory_mb - task.requirement.memory_mb


RANKERS: tuple[Ranker, ...] = (
    Ranker("free_cards_after", free_cards_after),
    Ranker("card_room_after", card_room_after),
    Ranker("free_memory_mb_after", free_memory_after),
)


NAMES: tuple[str, ...] = tuple(r.name for r in RANKERS)


def score(fit: Fit, task: PendingTask) -> Score:
    """Lower is better: every ranker's score, in `RANKERS` order."""
    return tuple([r.score(fit, task) for r in RANKERS])


def named_scores(fit: Fit, task: PendingTask) -> dict[str, float]:
    """Every ranker's score of `fit`, by the ranker's name."""
    return {r.name: r.score(fit, task) for r in RANKERS}


def seeded_shuffle(items: Sequence[T], seed: str, key: Callable[[T], str]) -> list[T]:
    """Shuffle deterministically: sort by `key` first so the input order does not matter."""
    out = sorted(items, key=key)
    random.Random(seed).shuffle(out)
    return out


def ranked(fits: Sequence[Fit], task: PendingTask) -> list[tuple[Score, Fit]]:
    """(score, fit), best first; equal scores keep their seeded-shuffle order."""
    shuffled = seeded_shuffle(fits, task.task_id, key=lambda f: f.node.id)
    scored = [(score(f, task), f) for f in shuffled]
    scored.sort(key=_by_score)  # stable: ties stay in shuffle order
    return scored


def _by_score(scored: tuple[Score, Fit]) -> Score:
    return scored[0]


def rank(fits: Sequence[Fit], task: PendingTask) -> list[Fit]:
    """Best first; equal scores keep their seeded-shuffle order."""
    return [f for _, f in ranked(fits, task)]


def named(scores: Score) -> dict[str, float]:
    """A score by its rankers' names."""
    return dict(zip(NAMES, scores, strict=True))
