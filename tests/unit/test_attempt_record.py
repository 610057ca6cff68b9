"""The agent's attempt record (agent/attempts.py) and the retention window's order
(agent/retention.py): what survives a restart, a torn write, compaction and pruning."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent import attempts
from agent.attempts import FILE, AttemptRecord
from agent.retention import Retention
from agent.runtimes.base import Handle
from libs.domain.protocol import AgentReport, Fact
from libs.domain.task.states import TaskStatus


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def exited(task_id: str, attempt: int = 0, code: int = 0) -> AgentReport:
    return AgentReport(
        node_id="n1",
        task_id=task_id,
        attempt=attempt,
        fact=Fact.EXITED,
        expected_status=TaskStatus.RUNNING,
        exit_code=code,
        output_tail=["done"],
        at=datetime(2026, 1, 1, tzinfo=UTC),
    )


def test_started_and_ended_attempts_are_read_back_after_a_restart(tmp_path: Path) -> None:
    record = AttemptRecord(tmp_path, keep_s=60)
    record.started("a", 0)
    record.started("b", 2)
    record.ended(exited("b", 2, code=3))
    again = AttemptRecord(tmp_path, keep_s=60)
    a, b = again.get("a", 0), again.get("b", 2)
    assert a is not None and not a.ended
    assert b is not None and b.report is not None and b.report.exit_code == 3
    assert b.report.output_tail == ["done"]
    assert again.get("b", 1) is None and again.get("c", 0) is None


def test_a_line_torn_by_a_crash_is_skipped_and_the_log_stays_appendable(tmp_path: Path) -> None:
    record = AttemptRecord(tmp_path, keep_s=60)
    record.started("a", 0)
    with (tmp_path / FILE).open("ab") as f:
        f.write(b'{"task":"b","attempt":0,"at":1')  # the write that never returned
    again = AttemptRecord(tmp_path, keep_s=60)
    assert len(again) == 1 and again.get("b", 0) is None
    again.started("c", 0)
    assert {k for k in ("a", "c") if AttemptRecord(tmp_path, keep_s=60).get(k, 0)} == {"a", "c"}


def test_the_log_is_compacted_to_its_live_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(attempts, "COMPACT_MIN_LINES", 8)  # each line is fsynced: keep it short
    record = AttemptRecord(tmp_path, keep_s=60)
    n = 2 * attempts.COMPACT_MIN_LINES
    for i in range(n):  # each attempt written twice: started, then ended
        record.started(f"t{i}", 0)
        record.ended(exited(f"t{i}"))
    lines = (tmp_path / FILE).read_bytes().count(b"\n")
    assert lines < 2 * n  # rewritten on the way
    assert len(AttemptRecord(tmp_path, keep_s=60)) == n
    assert not (tmp_path / f"{FILE}.tmp").exists() and not list(tmp_path.glob("*.tmp"))


def test_prune_drops_attempts_past_the_horizon_but_never_a_live_one(tmp_path: Path) -> None:
    clock = Clock()
    record = AttemptRecord(tmp_path, keep_s=100, clock=clock)
    record.started("old", 0)
    record.ended(exited("old"))
    record.started("running", 0)
    clock.now += 50
    record.started("recent", 0)
    record.ended(exited("recent"))
    clock.now += 60  # `old` and `running` are 110 s old, `recent` 60 s
    assert record.prune(lambda key: key == ("running", 0)) == 1
    kept = AttemptRecord(tmp_path, keep_s=100, clock=clock)
    assert kept.get("old", 0) is None
    assert kept.get("running", 0) is not None and kept.get("recent", 0) is not None
    assert AttemptRecord(tmp_path, keep_s=0, clock=clock).prune(lambda _: False) == 0


def handle(task_id: str) -> Handle:
    return Handle(runtime="docker", id=f"c-{task_id}", task_id=task_id, attempt=0)


@pytest.mark.parametrize(
    "order",
    [["old", "mid", "new"], ["new", "mid", "old"], ["mid", "new", "old"]],
    ids=["oldest-first", "newest-first", "mixed"],
)
async def test_retention_removes_the_first_finished_whatever_order_they_come_in(
    order: list[str],
) -> None:
    """Re-adopted attempts reach the window in the runtime's listing order (docker: newest
    first); the window keeps the newest by finish time."""
    finished_at = {"old": 100.0, "mid": 200.0, "new": 300.0}
    removed: list[str] = []

    async def remove(h: Handle) -> None:
        removed.append(h.task_id)

    window = Retention(remove, keep=1, keep_s=0, clock=lambda: 1000.0)
    for task_id in order:
        await window.finished(handle(task_id), finished_at[task_id])
    assert sorted(removed) == ["mid", "old"]
    assert window.handle_for("new") == handle("new") and len(window) == 1
