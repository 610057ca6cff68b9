"""Which replicas a scale-down sheds, and how (seed 000 自动伸缩:
"split 模式优先缩连接数最低的副本", drained before they are removed). Pure: the group's
members and the routers' outstanding requests in, the commands out.

A group's members are ranks `0..size-1`. A scale-down first writes the new size (manual
scale, the AutoScaler: `decide_scale`); the shedding then ends the members beyond it, and the
AutoScaler's reconcile pass runs it on every pass, so a size change whose stops were lost
(a crash between the two writes) is finished there.

* Outside `split` the members beyond the size are the ones that go (rank 0 is never beyond
  a size of 1 or more).
* In a `split` group replicas are interchangeable: the ones that go are those at least
  `min_age_s` (60 s) old first, among them those with nothing to lose (not running: no
  request reaches them), then the fewest outstanding requests over every router, then the
  highest rank. A chosen replica below the size swaps ranks with a kept one beyond it
  (`task_rank_moved`), so the kept members are still ranks `0..size-1`.
* A running replica of a serving group that goes is marked `draining` (routers send it
  nothing new); the AutoScaler stops it once no router has a request in flight on it, or
  after the drain limit (120 s). One that is not running, or that serves nothing (no
  `serving` port: no router sends it requests), is stopped at once.

Without the routers' figures (the gateway's manual scale) a `split` choice that depends on
them is left to the AutoScaler, whose pass has them (`Shed.deferred`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from libs.domain.group.model import current_members, is_live
from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.task import decide as commands
from libs.domain.task.events import TaskDrainMarked, TaskRankMoved
from libs.domain.task.model import Task
from libs.domain.task.states import Actor, TaskStatus

S = TaskStatus
_LEAVING = frozenset({S.STOPPING, S.DRAINING, S.PREEMPTING})


@dataclass(frozen=True)
class Shed:
    drain: tuple[str, ...] = ()  # running replicas marked draining
    stop: tuple[str, ...] = ()  # replicas not running, stopped at once
    moves: tuple[tuple[str, int, int], ...] = ()  # (task id, from rank, to rank)
    deferred: bool = False  # the choice needs the routers' figures

    @property
    def removed(self) -> tuple[str, ...]:
        return self.drain + self.stop

    @property
    def empty(self) -> bool:
        return not (self.drain or self.stop or self.moves)


@dataclass(frozen=True)
class Candidate:
    task_id: str
    rank: int
    running: bool
    age_s: float
    outstanding: int = 0
    serves: bool = True  # declares a serving port: routers may hold requests on it


def candidates(tasks: Sequence[Task], now: datetime) -> list[Candidate]:
    """The members a scale-down may shed: live, not leaving, not already draining."""
    return [
        Candidate(
            m.id,
            m.rank,
            m.status is S.RUNNING,
            (now - m.created_at).total_seconds(),
            serves=m.spec.serving is not None,
        )
        for m in current_members(tasks)
        if m.rank is not None and is_live(m) and m.status not in _LEAVING and not m.draining
    ]


def shed_order(
    candidates: Sequence[Candidate], *, min_age_s: float, figures: bool = True
) -> list[Candidate]:
    """A `split` group's replicas in the order a scale-down takes them (module docstring)."""

    def key(c: Candidate) -> tuple[bool, bool, int, int]:
        return (c.age_s < min_age_s, c.running, c.outstanding if figures else 0, -c.rank)

    return sorted(candidates, key=key)


def plan_shed(
    candidates: Sequence[Candidate],
    size: int,
    *,
    split: bool,
    min_age_s: float,
    outstanding: Mapping[str, int] | None,
) -> Shed:
    """What a group of `size` does with its sheddable members (`candidates`, their
    `outstanding` ignored: it comes from `outstanding`, None when unknown; a group that
    serves nothing needs no figures)."""
    figures = outstanding is not None or not any(c.serves for c in candidates)
    with_counts = [
        Candidate(
            c.task_id,
            c.rank,
            c.running,
            c.age_s,
            (outstanding or {}).get(c.task_id, 0),
            c.serves,
        )
        for c in candidates
    ]
    beyond = [c for c in with_counts if c.rank >= size]
    if not beyond:
        return Shed()
    if not split:
        chosen = beyond
    else:
        order = shed_order(with_counts, min_age_s=min_age_s, figures=figures)
        chosen = order[: len(beyond)]
        if not figures and any(c.running for c in chosen) and len(with_counts) > len(chosen):
            return Shed(deferred=True)
    chosen_ids = {c.task_id for c in chosen}
    low = sorted((c for c in chosen if c.rank < size), key=lambda c: c.rank)
    high = sorted((c for c in beyond if c.task_id not in chosen_ids), key=lambda c: c.rank)
    moves: list[tuple[str, int, int]] = []
    for went, kept in zip(low, high, strict=True):
        moves += [(kept.task_id, kept.rank, went.rank), (went.task_id, went.rank, kept.rank)]
    return Shed(
        drain=tuple(c.task_id for c in chosen if c.running and c.serves),
        stop=tuple(c.task_id for c in chosen if not (c.running and c.serves)),
        moves=tuple(moves),
    )


def shed_commands(shed: Shed, actor: Actor, why: str) -> dict[str, commands.Decide]:
    """The task commands of a shed, for one batch (one transaction): each task's rank move,
    then its drain mark or stop. A task that changed since it was read (another rank, ended,
    already draining) is refused, and its batch-mates still commit; the next reconcile pass
    sees the result and decides again."""
    moved = {tid: (src, dst) for tid, src, dst in shed.moves}
    ids = [m[0] for m in shed.moves] + list(shed.drain) + list(shed.stop)
    out: dict[str, commands.Decide] = {}
    for tid in dict.fromkeys(ids):
        out[tid] = _command(
            moved.get(tid), drain=tid in shed.drain, stop=tid in shed.stop, actor=actor, why=why
        )
    return out


def _command(
    move: tuple[int, int] | None, *, drain: bool, stop: bool, actor: Actor, why: str
) -> commands.Decide:
    code = ReasonCode.SCALED_DOWN

    def decide(t: Task) -> list[Payload]:
        if not is_live(t) or t.draining or t.status in _LEAVING:
            return []  # ended or leaving already: nothing to do
        events: list[Payload] = []
        if move is not None:
            src, dst = move
            if t.rank != src:
                return []  # moved since it was read: the next pass decides again
            events.append(
                TaskRankMoved(
                    task_id=t.id,
                    from_rank=src,
                    to_rank=dst,
                    reason_code=code,
                    reason=f"rank {src} → {dst}: {why}",
                )
            )
        rank = move[1] if move is not None else t.rank
        if drain and t.status is S.RUNNING:
            events.append(
                TaskDrainMarked(task_id=t.id, reason_code=code, reason=f"rank {rank} {why}")
            )
        elif drain or stop:
            events += commands.decide_stop(t, actor, code, f"rank {rank} {why}")
        return events

    return decide
