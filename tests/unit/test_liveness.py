"""The liveness floor: a task is dead only past the floor AND with two signals of death."""

from __future__ import annotations

import pytest

from libs.domain.task.liveness import Health, LivenessWatch, TaskLiveness, is_dead

FLOOR, STALE = 900.0, 30.0


def watch(
    container: str, health: Health, *, positive_at: float | None, evidence_at: float
) -> LivenessWatch:
    w = LivenessWatch(
        "n1",
        first_seen=0.0,
        last_evidence_at=evidence_at,
        evidence=TaskLiveness(container=container, health=health),
    )
    w.last_positive = positive_at
    return w


@pytest.mark.parametrize(
    ("container", "health", "positive_at", "evidence_at", "now", "dead"),
    [
        # Idle but healthy (GPU idleness is no signal): never dead.
        ("running", Health.OK, 1000.0, 1000.0, 1000.0, False),
        ("running", Health.NONE, 0.0, 2000.0, 2000.0, False),
        # Frozen: not running + health failing, past the floor.
        ("paused", Health.FAILING, 0.0, 950.0, 950.0, True),
        # ... but not before the floor.
        ("paused", Health.FAILING, 100.0, 950.0, 950.0, False),
        # One signal only (health failing, container running): not dead.
        ("running", Health.FAILING, 0.0, 950.0, 950.0, False),
        # Container gone and its evidence stale: two signals.
        ("missing", Health.NONE, 0.0, 900.0, 950.0, True),
        # No evidence for long, last seen running and healthy: one signal only.
        ("running", Health.OK, 0.0, 0.0, 2000.0, False),
        # Never positive: the floor counts from when it was first seen.
        ("exited", Health.FAILING, None, 800.0, 800.0, False),
        ("exited", Health.FAILING, None, 901.0, 901.0, True),
    ],
)
def test_is_dead(
    container: str,
    health: Health,
    positive_at: float | None,
    evidence_at: float,
    now: float,
    dead: bool,
) -> None:
    w = watch(container, health, positive_at=positive_at, evidence_at=evidence_at)
    assert bool(is_dead(w, now, FLOOR, STALE)) is dead


def test_observe_moves_the_last_positive_time() -> None:
    w = watch("paused", Health.FAILING, positive_at=None, evidence_at=0.0)
    w.observe(TaskLiveness(container="running", health=Health.OK), 500.0)
    assert w.last_positive == 500.0
    w.observe(TaskLiveness(container="paused", health=Health.FAILING), 600.0)
    assert w.last_positive == 500.0 and w.last_evidence_at == 600.0
