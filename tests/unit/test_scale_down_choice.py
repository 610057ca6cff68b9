"""Which replicas a scale-down sheds (libs/domain/group/shedding.py): a `split` group's least
busy by the routers' outstanding requests, rank 0 of a non-split group kept, young replicas
kept, the kept members renumbered into `0..size-1`, and the commands one batch writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from libs.domain.group.shedding import Candidate, Shed, candidates, plan_shed, shed_commands
from libs.domain.reasons import ReasonCode
from libs.domain.task.events import TaskDrainMarked, TaskRankMoved
from libs.domain.task.evolve import evolve_task
from libs.domain.task.model import Task, TaskSpec
from libs.domain.task.states import Actor, TaskStatus

OLD = 600.0


def c(tid: str, rank: int, *, running: bool = True, age: float = OLD) -> Candidate:
    return Candidate(tid, rank, running, age)


THREE = [c("a", 0), c("b", 1), c("c", 2)]

CASES = [
    pytest.param(
        THREE,
        2,
        True,
        {"a": 5, "b": 0, "c": 7},
        Shed(drain=("b",), moves=(("c", 2, 1), ("b", 1, 2))),
        id="split-least-outstanding-middle",
    ),
    pytest.param(
        THREE,
        2,
        True,
        {"a": 0, "b": 4, "c": 7},
        Shed(drain=("a",), moves=(("c", 2, 0), ("a", 0, 2))),
        id="split-rank-0-may-go",
    ),
    pytest.param(THREE, 2, True, {"a": 3, "b": 3, "c": 1}, Shed(drain=("c",)), id="split-top"),
    pytest.param(
        THREE,
        1,
        True,
        {"a": 1, "b": 9, "c": 2},
        Shed(drain=("a", "c"), moves=(("b", 1, 0), ("a", 0, 1))),
        id="split-two-go-busiest-kept",
    ),
    pytest.param(THREE, 2, True, {}, Shed(drain=("c",)), id="split-all-idle-highest-rank"),
    pytest.param(
        [c("a", 0), c("b", 1, age=10), c("c", 2)],
        2,
        True,
        {"a": 5, "b": 0, "c": 7},
        Shed(drain=("a",), moves=(("c", 2, 0), ("a", 0, 2))),
        id="split-young-kept",
    ),
    pytest.param(
        [c("a", 0), c("b", 1), c("c", 2, running=False)],
        2,
        True,
        {"a": 5, "b": 0},
        Shed(stop=("c",)),
        id="split-not-running-goes-first",
    ),
    pytest.param(
        THREE,
        1,
        False,
        {"a": 0, "b": 9, "c": 9},
        Shed(drain=("b", "c")),
        id="non-split-highest-ranks-rank-0-kept",
    ),
    pytest.param(THREE, 3, True, {"a": 9}, Shed(), id="at-size-nothing"),
]


@pytest.mark.parametrize(("members", "size", "split", "outstanding", "shed"), CASES)
def test_plan_shed(
    members: list[Candidate], size: int, split: bool, outstanding: dict[str, int], shed: Shed
) -> None:
    assert plan_shed(members, size, split=split, min_age_s=60, outstanding=outstanding) == shed


def test_without_figures_a_split_choice_between_running_replicas_is_deferred() -> None:
    shed = plan_shed(THREE, 2, split=True, min_age_s=60, outstanding=None)
    assert shed.deferred and shed.empty
    # outside split the choice needs no figures: the highest rank
    assert plan_shed(THREE, 2, split=False, min_age_s=60, outstanding=None) == Shed(drain=("c",))
    # nor when a replica that is not running is there to go
    pending = [c("a", 0), c("b", 1, running=False), c("c", 2)]
    shed = plan_shed(pending, 2, split=True, min_age_s=60, outstanding=None)
    assert shed == Shed(stop=("b",), moves=(("c", 2, 1), ("b", 1, 2)))


def test_a_group_that_serves_nothing_stops_at_once_without_figures() -> None:
    quiet = [Candidate(x.task_id, x.rank, True, OLD, serves=False) for x in THREE]
    assert plan_shed(quiet, 2, split=True, min_age_s=60, outstanding=None) == Shed(stop=("c",))
    assert plan_shed(quiet, 1, split=False, min_age_s=60, outstanding=None) == Shed(stop=("b", "c"))


def task(tid: str, rank: int, status: TaskStatus, created: datetime) -> Task:
    spec = TaskSpec.model_validate({"name": "web", "image": "busybox:latest"})
    return Task(
        id=tid,
        tenant_id="acme",
        spec=spec,
        group_id="grp-1",
        rank=rank,
        status=status,
        version=1,
        created_at=created,
        updated_at=created,
    )


def test_candidates_are_live_members_not_leaving_nor_draining() -> None:
    now = datetime.now(UTC)
    then = now - timedelta(seconds=90)
    tasks = [
        task("t0", 0, TaskStatus.RUNNING, then),
        task("t1", 1, TaskStatus.PENDING, now),
        task("t2", 2, TaskStatus.STOPPING, then),
        task("t3", 3, TaskStatus.RUNNING, then).model_copy(update={"draining": True}),
        task("t4", 4, TaskStatus.CANCELLED, then),
    ]
    assert candidates(tasks, now) == [
        Candidate("t0", 0, True, 90.0, serves=False),
        Candidate("t1", 1, False, 0, serves=False),
    ]


def test_the_commands_swap_ranks_then_drain() -> None:
    now = datetime.now(UTC)
    b, cc = task("b", 1, TaskStatus.RUNNING, now), task("c", 2, TaskStatus.RUNNING, now)
    shed = Shed(drain=("b",), moves=(("c", 2, 1), ("b", 1, 2)))
    cmds = shed_commands(shed, Actor.CONTROLLER, "removed by a scale-down")
    assert list(cmds) == ["c", "b"]
    [moved] = cmds["c"](cc)
    assert isinstance(moved, TaskRankMoved) and (moved.from_rank, moved.to_rank) == (2, 1)
    went = cmds["b"](b)
    assert [type(e) for e in went] == [TaskRankMoved, TaskDrainMarked]
    assert all(getattr(e, "reason_code", None) is ReasonCode.SCALED_DOWN for e in went)
    folded = evolve_task(evolve_task(b, went[0], now, 2), went[1], now, 3)
    assert (folded.rank, folded.draining, folded.status) == (2, True, TaskStatus.RUNNING)
    # a task that moved since it was read is left alone; a pending one is stopped at once
    assert cmds["c"](cc.model_copy(update={"rank": 0})) == []
    stop = shed_commands(Shed(stop=("p",)), Actor.CONTROLLER, "removed")["p"]
    [cancel] = stop(task("p", 2, TaskStatus.PENDING, now))
    assert getattr(cancel, "to_status", None) is TaskStatus.CANCELLED
