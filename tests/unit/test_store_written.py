"""The store's kept task documents (libs/store/written.py): newest version per task, bounded,
merged with what the caller read by version."""

from __future__ import annotations

from datetime import UTC, datetime

from libs.domain.task.model import Task, TaskSpec
from libs.store.written import Written

AT = datetime(2026, 12, 2, tzinfo=UTC)


def task(task_id: str, version: int) -> Task:
    return Task(
        id=task_id,
        tenant_id="acme",
        spec=TaskSpec(name="t", image="busybox"),
        version=version,
        created_at=AT,
        updated_at=AT,
    )


def test_keeps_the_newest_version_of_each_task() -> None:
    w = Written()
    w.add([task("a", 2), task("b", 1)])
    w.add([task("a", 1)])  # an older commit reported late does not replace a newer one
    w.add([task("b", 3)])
    assert {i: t.version for i, t in w.known(["a", "b", "c"]).items()} == {"a": 2, "b": 3}


def test_drops_the_oldest_written_beyond_its_limit() -> None:
    w = Written(limit=3)
    w.add(task(i, 1) for i in "abcd")
    w.add([task("b", 2)])  # written again: the newest
    w.add([task("e", 1)])
    assert sorted(w.known("abcde")) == ["b", "d", "e"] and len(w) == 3


def test_what_the_caller_read_wins_where_it_is_newer() -> None:
    w = Written()
    w.add([task("a", 2), task("b", 5)])
    read = {"a": task("a", 4), "b": task("b", 4), "c": task("c", 1)}
    got = w.known(["a", "b", "c", "d"], read)
    assert {i: t.version for i, t in got.items()} == {"a": 4, "b": 5, "c": 1}
