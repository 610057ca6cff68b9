"""All 196 (from, to) pairs of the state machine, table-driven against the SPEC §1 table."""

from __future__ import annotations

import itertools

import pytest

from libs.domain.task.states import (
    GPU_HOLDING,
    REPORT_BLACKLIST,
    TERMINAL,
    Actor,
    IllegalTransition,
    TaskStatus,
    check_transition,
    is_allowed,
)

S = TaskStatus

# The table of SPEC §1, written out independently of the module under test.
EXPECTED = {
    "pending": "scheduled cancelled failed",
    "scheduled": "starting running pending stopping preempting failed cancelled",
    "starting": "running completed failed pending stopping",
    "running": "completed failed sleeping stopping draining preempting pending",
    "sleeping": "waking stopping pending failed",
    "waking": "running pending failed stopping",
    "stopping": "stopped failed",
    "draining": "cancelled stopped failed",
    "preempting": "pending stopped failed",
    "paused": "pending stopped",
    "completed": "",
    "failed": "pending",
    "cancelled": "",
    "stopped": "",
}
ALLOWED = {(S(a), S(b)) for a, tos in EXPECTED.items() for b in tos.split()}
PAIRS = list(itertools.product(TaskStatus, TaskStatus))


def test_fourteen_states_and_sets() -> None:
    assert len(TaskStatus) == 14 and len(PAIRS) == 196
    assert {s.value for s in TERMINAL} == {"completed", "failed", "cancelled", "stopped"}
    assert {s.value for s in GPU_HOLDING} == {
        "scheduled",
        "starting",
        "running",
        "sleeping",
        "waking",
        "stopping",
        "draining",
        "preempting",
    }
    assert not TERMINAL & GPU_HOLDING


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=[f"{a.value}->{b.value}" for a, b in PAIRS])
def test_pair(src: TaskStatus, dst: TaskStatus) -> None:
    # failed -> pending belongs to the retry engine; every other edge to any actor.
    actor = Actor.RETRY_ENGINE if (src, dst) == (S.FAILED, S.PENDING) else Actor.SCHEDULER
    if (src, dst) in ALLOWED:
        check_transition(src, dst, actor)
        assert is_allowed(src, dst, actor)
    else:
        with pytest.raises(IllegalTransition, match=f"{src.value} -> {dst.value}"):
            check_transition(src, dst, actor)
        assert not is_allowed(src, dst, actor)


@pytest.mark.parametrize("actor", [a for a in Actor if a is not Actor.RETRY_ENGINE])
def test_failed_to_pending_only_by_retry_engine(actor: Actor) -> None:
    with pytest.raises(IllegalTransition, match="only retry_engine"):
        check_transition(S.FAILED, S.PENDING, actor)


@pytest.mark.parametrize("src", list(TaskStatus))
def test_nothing_enters_paused(src: TaskStatus) -> None:
    with pytest.raises(IllegalTransition):
        check_transition(src, S.PAUSED, Actor.OPERATOR)
    with pytest.raises(IllegalTransition):
        check_transition(src, S.PAUSED, Actor.AGENT, report=True)


def test_stopping_to_completed_refused_twice() -> None:
    """Defence in depth: refused by the whitelist and again by the report blacklist."""
    assert (S.STOPPING, S.COMPLETED) in REPORT_BLACKLIST
    with pytest.raises(IllegalTransition, match="report path"):
        check_transition(S.STOPPING, S.COMPLETED, Actor.AGENT, report=True)
    with pytest.raises(IllegalTransition):
        check_transition(S.STOPPING, S.COMPLETED, Actor.AGENT)


def test_pending_to_completed_refused() -> None:
    with pytest.raises(IllegalTransition):
        check_transition(S.PENDING, S.COMPLETED, Actor.OPERATOR)
