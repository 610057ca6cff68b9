"""The history checker's invariants over synthetic event logs, table-driven: a clean history
passes, and each broken invariant is caught, named, and shown with the event that broke it."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from libs.domain.invariants import HistoryChecker, Invariant, LoggedEvent
from libs.domain.node.events import NodeRegistered
from libs.domain.node.model import GpuCard, NodeInventory
from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.task.events import TaskCreated, TaskRetryDecided, TaskStatusChanged
from libs.domain.task.lending import TaskCardLent, TaskCardReturned
from libs.domain.task.model import TaskId, TaskSpec, TenantId
from libs.domain.task.states import TaskStatus as S

T0 = datetime(2026, 1, 1, tzinfo=UTC)
CARD_MB = 80_000
V = Invariant


class Log:
    """Builds a log the way the store writes one: positions in order, versions per stream."""

    def __init__(self) -> None:
        self.events: list[LoggedEvent] = []
        self.versions: dict[str, int] = {}
        self.status: dict[str, S] = {}

    def raw(self, stream: str, stream_type: str, type_: str, payload: str, version: int) -> str:
        eid = str(uuid.uuid4())
        n = len(self.events) + 1
        at = T0 + timedelta(seconds=n)
        self.events.append(LoggedEvent(n, eid, stream, stream_type, version, type_, payload, at))
        self.versions[stream] = max(version, self.versions.get(stream, 0))
        return eid

    def add(self, stream: str, payload: Payload, version: int | None = None) -> str:
        v = self.versions.get(stream, 0) + 1 if version is None else version
        return self.raw(stream, payload.stream_type, payload.type, payload.model_dump_json(), v)

    def node(self, node_id: str, *cards: str) -> None:
        gpus = tuple(
            GpuCard(id=c, index=i, vendor="nvidia", model="H100", vram_mb=CARD_MB)
            for i, c in enumerate(cards)
        )
        inv = NodeInventory(memory_mb=64_000, cpu_cores=16, gpus=gpus)
        self.add(node_id, NodeRegistered(node_id=node_id, inventory=inv))

    def task(self, task_id: str, **spec: Any) -> str:
        body = TaskSpec(name=task_id, image="busybox:latest", **spec)
        self.status[task_id] = S.PENDING
        return self.add(
            task_id,
            TaskCreated(task_id=TaskId(task_id), tenant_id=TenantId("acme"), spec=body),
        )

    def move(self, task_id: str, to: S, actor: str = "agent", **kw: Any) -> str:
        src = kw.pop("src", self.status[task_id])
        self.status[task_id] = to
        ev = TaskStatusChanged(
            task_id=TaskId(task_id),
            from_status=src,
            to_status=to,
            actor=actor,
            reason_code=ReasonCode.REPORTED,
            **kw,
        )
        return self.add(task_id, ev)

    def run(self, task_id: str, node: str, *cards: str) -> None:
        self.move(task_id, S.SCHEDULED, "scheduler", node_id=node, gpu_ids=cards)
        self.move(task_id, S.STARTING)
        self.move(task_id, S.RUNNING, node_id=node)


def clean(log: Log) -> None:
    """A busy history that breaks nothing: shared cards, a retry elsewhere, a migration."""
    log.node("n1", "g0", "g1")
    log.node("n2", "g0")
    log.task("whole", gpu_required=1)
    log.run("whole", "n1", "g0")
    log.task("half-a", gpu_compute_ratio=0.5)
    log.task("half-b", gpu_memory_mb=CARD_MB // 2)
    log.run("half-a", "n1", "g1")
    log.run("half-b", "n1", "g1")
    log.move("whole", S.COMPLETED, exit_code=0)
    log.task("next", gpu_required=1)  # the card `whole` left is free again
    log.run("next", "n1", "g0")
    log.move("next", S.FAILED, exit_code=1)
    retried = TaskRetryDecided(
        task_id=TaskId("next"),
        attempt=1,
        node_id="n1",
        failure_class="unknown",
        failure_kind="exit",
        action="retry",
        reason="retry elsewhere",
    )
    log.add("next", retried)
    log.move("next", S.PENDING, "retry_engine", retry_count=1, clear_placement=True)
    log.run("next", "n2", "g0")
    log.move("next", S.COMPLETED, exit_code=0)
    log.move("half-a", S.PENDING, "controller", clear_placement=True)  # node lost
    log.run("half-a", "n2", "g0")  # beside nothing: `next` has completed
    log.move("half-a", S.STOPPING, "tenant")
    log.move("half-a", S.STOPPED)
    log.task("queued")
    log.move("queued", S.CANCELLED, "tenant")


def _sleeper_and_borrower(log: Log, *, lend: bool) -> None:
    log.node("n1", "g0")
    log.task("engine", gpu_required=1)
    log.run("engine", "n1", "g0")
    log.move("engine", S.SLEEPING, "tenant")
    log.task("train", gpu_required=1)
    if lend:
        loan = TaskCardLent(task_id=TaskId("engine"), borrower_task_id="train", node_id="n1",
                            gpu_ids=("g0",))  # fmt: skip
        log.add("engine", loan)
    log.move("train", S.SCHEDULED, "scheduler", node_id="n1", gpu_ids=("g0",))


def lent_card(log: Log) -> None:
    """A sleeper's card lent, used, given back; the sleeper woken on it afterwards."""
    _sleeper_and_borrower(log, lend=True)
    log.move("train", S.STARTING)
    log.move("train", S.RUNNING, node_id="n1")
    log.move("train", S.COMPLETED, exit_code=0)
    back = TaskCardReturned(task_id=TaskId("engine"), borrower_task_id="train",
                            borrower_status="completed", wake=True)  # fmt: skip
    log.add("engine", back)
    log.move("engine", S.WAKING, "scheduler")
    log.move("engine", S.RUNNING)


def borrowed_without_a_loan(log: Log) -> None:
    _sleeper_and_borrower(log, lend=False)


def lender_woken_before_the_return(log: Log) -> None:
    _sleeper_and_borrower(log, lend=True)
    log.move("engine", S.WAKING, "tenant")


def illegal_edge(log: Log) -> None:
    log.task("t")
    log.move("t", S.RUNNING, node_id="n1")  # never scheduled


def stale_from(log: Log) -> None:
    log.task("t")
    log.move("t", S.SCHEDULED, "scheduler", src=S.FAILED, node_id="n1")


def reopened(log: Log) -> None:
    log.task("t")
    log.run("t", "n1")
    log.move("t", S.COMPLETED, exit_code=0)
    log.move("t", S.RUNNING)


def retry_by_the_wrong_actor(log: Log) -> None:
    log.task("t")
    log.move("t", S.FAILED, "controller")
    log.move("t", S.PENDING, "scheduler")


def retries_spent(log: Log) -> None:
    log.task("t", max_retries=1)
    log.move("t", S.FAILED, "controller")
    log.move("t", S.PENDING, "retry_engine", retry_count=1)
    log.move("t", S.FAILED, "controller")
    log.move("t", S.PENDING, "retry_engine", retry_count=2)


def two_nodes(log: Log) -> None:
    log.task("t")
    log.move("t", S.SCHEDULED, "scheduler", node_id="n1")
    log.move("t", S.RUNNING, node_id="n2")  # n1 never gave it up


def two_whole_tasks_one_card(log: Log) -> None:
    log.node("n1", "g0")
    log.task("a", gpu_required=1)
    log.task("b", gpu_required=1)
    log.run("a", "n1", "g0")
    log.move("b", S.SCHEDULED, "scheduler", node_id="n1", gpu_ids=("g0",))


def fractions_past_the_compute(log: Log) -> None:
    log.node("n1", "g0")
    for t in ("a", "b"):
        log.task(t, gpu_compute_ratio=0.6)
        log.move(t, S.SCHEDULED, "scheduler", node_id="n1", gpu_ids=("g0",))


def fractions_past_the_vram(log: Log) -> None:
    log.node("n1", "g0")
    for t, mb in (("a", 50_000), ("b", 40_000)):
        log.task(t, gpu_compute_ratio=0.3, gpu_memory_mb=mb)
        log.move(t, S.SCHEDULED, "scheduler", node_id="n1", gpu_ids=("g0",))


def one_card_listed_twice(log: Log) -> None:
    log.node("n1", "g0")
    log.task("a", gpu_required=2)
    log.move("a", S.SCHEDULED, "scheduler", node_id="n1", gpu_ids=("g0", "g0"))


def version_gap(log: Log) -> None:
    log.task("t")
    log.move("t", S.SCHEDULED, "scheduler", node_id="n1")
    ev = TaskStatusChanged(
        task_id=TaskId("t"),
        from_status=S.SCHEDULED,
        to_status=S.STARTING,
        actor="agent",
        reason_code=ReasonCode.REPORTED,
    )
    log.add("t", ev, version=4)


def stream_without_creation(log: Log) -> None:
    log.status["t"] = S.PENDING
    log.move("t", S.CANCELLED, "tenant")


def event_in_another_stream(log: Log) -> None:
    log.task("t")
    log.task("u")
    ev = TaskStatusChanged(
        task_id=TaskId("u"),
        from_status=S.PENDING,
        to_status=S.CANCELLED,
        actor="tenant",
        reason_code=ReasonCode.REPORTED,
    )
    log.add("t", ev)


def unreadable(log: Log) -> None:
    log.task("t")
    log.raw("t", "task", "task_status_changed", '{"task_id": "t", "to_status": "lost"}', 2)


def unknown_type(log: Log) -> None:
    log.raw("t", "task", "task_teleported", "{}", 1)


CASES: list[tuple[str, Callable[[Log], None], Invariant | None]] = [
    ("clean", clean, None),
    ("pending->running", illegal_edge, V.ILLEGAL_TRANSITION),
    ("from status not the task's", stale_from, V.FROM_STATUS),
    ("completed->running", reopened, V.TERMINAL_REOPENED),
    ("failed->pending not by the retry engine", retry_by_the_wrong_actor, V.ILLEGAL_TRANSITION),
    ("retry past max_retries", retries_spent, V.ILLEGAL_TRANSITION),
    ("running on a second node", two_nodes, V.TWO_NODES),
    ("two whole tasks on one card", two_whole_tasks_one_card, V.CARD_OVERCOMMITTED),
    ("fractions over 100% compute", fractions_past_the_compute, V.CARD_OVERCOMMITTED),
    ("fractions over the card's VRAM", fractions_past_the_vram, V.CARD_OVERCOMMITTED),
    ("one card listed twice", one_card_listed_twice, V.CARD_OVERCOMMITTED),
    ("a lent card held by its borrower", lent_card, None),
    ("a sleeper's card taken without a loan", borrowed_without_a_loan, V.CARD_OVERCOMMITTED),
    (
        "a lender woken before its card is back",
        lender_woken_before_the_return,
        V.CARD_OVERCOMMITTED,
    ),
    ("version gap", version_gap, V.VERSION_GAP),
    ("stream without its creation", stream_without_creation, V.MISSING_CREATE),
    ("event in another task's stream", event_in_another_stream, V.STREAM_MISMATCH),
    ("payload that does not parse", unreadable, V.UNREADABLE),
    ("unknown event type", unknown_type, V.UNREADABLE),
]


@pytest.mark.parametrize(("build", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_invariant(build: Callable[[Log], None], expected: Invariant | None) -> None:
    log = Log()
    build(log)
    checker = HistoryChecker()
    checker.feed_all(log.events)
    if expected is None:
        assert checker.clean, [v.message for v in checker.violations]
        assert checker.events == len(log.events)
        return
    assert set(checker.counts) == {expected}, [v.message for v in checker.violations]
    (violation,) = checker.violations
    # The violation shows the event that broke the invariant (the last one written here).
    assert log.events[-1].event_id in {e.event_id for e in violation.events}
    assert violation.view()["invariant"] == expected.value


def test_the_over_committed_card_names_every_holder() -> None:
    log = Log()
    two_whole_tasks_one_card(log)
    checker = HistoryChecker()
    checker.feed_all(log.events)
    (v,) = checker.violations
    assert {e.stream_id for e in v.events} == {"a", "b"}
    assert "card g0 on n1 (80000 MB)" in v.message and "2.00 of its compute" in v.message


def test_an_acknowledged_create_missing_from_the_log_is_named() -> None:
    log = Log()
    log.task("t")
    checker = HistoryChecker()
    checker.feed_all(log.events)
    checker.expect_created(["t", "task-acked-but-lost"])
    assert [v.invariant for v in checker.violations] == [V.MISSING_CREATE]
    assert "task-acked-but-lost" in checker.violations[0].message


def test_a_missing_creation_is_reported_once_per_stream() -> None:
    log = Log()
    log.status["t"] = S.PENDING
    log.move("t", S.SCHEDULED, "scheduler", node_id="n1")
    log.move("t", S.RUNNING)
    checker = HistoryChecker()
    checker.feed_all(log.events)
    assert checker.counts == {V.MISSING_CREATE: 1}


def test_listing_stops_at_the_bound_and_counting_does_not() -> None:
    log = Log()
    for i in range(5):
        illegal_edge_for = f"t{i}"
        log.task(illegal_edge_for)
        log.move(illegal_edge_for, S.COMPLETED)  # pending -> completed
    checker = HistoryChecker(max_reported=2)
    checker.feed_all(log.events)
    assert checker.counts[V.ILLEGAL_TRANSITION] == 5 and len(checker.violations) == 2
