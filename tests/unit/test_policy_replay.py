"""Policy replay, pure parts: `--set` parsing, and the engine over a hand-written log (tasks
on one node, a preemption, preemption switched off, a withdrawal, a retry, a queue's
priority raised)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from libs.domain.node.events import NodeRegistered
from libs.domain.node.model import GpuCard, NodeInventory
from libs.domain.payload import Payload
from libs.domain.pool.events import PoolCreated, QueueCreated
from libs.domain.pool.model import NodeSelector, PoolSpec, QueueSpec, pool_stream, queue_stream
from libs.domain.reasons import ReasonCode
from libs.domain.task.events import TaskCreated, TaskStatusChanged
from libs.domain.task.model import TaskId, TaskSpec, TenantId
from libs.domain.task.states import Actor, TaskStatus
from services.scheduler.replay import PolicyError, parse_sets, record, replay_report
from services.scheduler.replay.report import figures, percentile

T0 = datetime(2026, 11, 1, tzinfo=UTC)
S = TaskStatus


@pytest.mark.parametrize(
    ("sets", "quotas", "queues", "preemption"),
    [
        (["quota.tenant-a.max_gpus=8"], {"tenant-a": 8.0}, {}, True),
        (["queue.alg.priority=900"], {}, {"alg": {"priority": 900}}, True),
        (
            ["queue.q.max_gpus=4", "queue.q.policy=fifo", "queue.q.max_running_jobs=2"],
            {},
            {"q": {"max_gpus": 4, "fifo": True, "max_running_jobs": 2}},
            True,
        ),
        (["preemption=off"], {}, {}, False),
        ([], {}, {}, True),
    ],
    ids=["tenant quota", "queue priority", "queue quota and order", "no preemption", "none"],
)
def test_sets_parse(
    sets: list[str], quotas: dict[str, float], queues: dict[str, Any], preemption: bool
) -> None:
    policy = parse_sets(sets)
    assert dict(policy.quotas) == quotas
    assert {k: dict(v) for k, v in policy.queues.items()} == queues
    assert policy.preemption is preemption and policy.changed is bool(sets)


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ("quota.a.max_gpus=-1", "whole number"),
        ("quota.a.max_gpus=lots", "whole number"),
        ("queue.q.policy=random", "fifo or priority"),
        ("preemption=maybe", "on or off"),
        ("autoscaler.web.target=0", "> 0"),
        ("autoscaler.web.metric=qps", "autoscaler.<group>.target"),
        ("quota.a.gpus=3", "unknown setting 'quota.a.gpus'"),
        ("quota.a.max_gpus", "KEY=VALUE"),
    ],
    ids=[
        "negative",
        "not a number",
        "bad order",
        "bad switch",
        "autoscaler target 0",
        "autoscaler metric",
        "unknown",
        "no =",
    ],
)
def test_a_bad_set_is_refused_by_name(item: str, words: str) -> None:
    with pytest.raises(PolicyError, match=words):
        parse_sets([item])


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.95) == 95.0


class Log:
    """A log written by hand, in the shapes the platform writes."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, int, str, str, datetime]] = []
        self.versions: dict[str, int] = {}
        self.status: dict[str, TaskStatus] = {}

    def add(self, stream_id: str, event: Payload, second: float) -> None:
        v = self.versions[stream_id] = self.versions.get(stream_id, 0) + 1
        at = T0 + timedelta(seconds=second)
        self.rows.append((event.stream_type, stream_id, v, event.type, event.model_dump_json(), at))

    def node(self, node_id: str, cards: int, second: float = 0) -> None:
        gpus = tuple(
            GpuCard(id=f"{node_id}-g{i}", index=i, vendor="nvidia", model="A100", vram_mb=40_960)
            for i in range(cards)
        )
        inv = NodeInventory(memory_mb=65_536, cpu_cores=32, gpus=gpus)
        self.add(node_id, NodeRegistered(node_id=node_id, inventory=inv), second)

    def task(self, task_id: str, tenant: str, second: float, **spec: Any) -> None:
        s = TaskSpec(name="t", image="img", **({"gpu_required": 1} | spec))
        self.add(
            task_id,
            TaskCreated(task_id=TaskId(task_id), tenant_id=TenantId(tenant), spec=s),
            second,
        )
        self.status[task_id] = S.PENDING

    def move(
        self, task_id: str, to: TaskStatus, second: float, actor: Actor = Actor.AGENT, **kw: Any
    ) -> None:
        ev = TaskStatusChanged(
            task_id=TaskId(task_id),
            from_status=self.status[task_id],
            to_status=to,
            actor=actor.value,
            reason_code=ReasonCode.PLACED,
            **kw,
        )
        self.add(task_id, ev, second)
        self.status[task_id] = to

    def place(self, task_id: str, node: str, cards: tuple[str, ...], second: float) -> None:
        self.move(task_id, S.SCHEDULED, second, Actor.SCHEDULER, node_id=node, gpu_ids=cards)
        self.move(task_id, S.RUNNING, second)


def preemption_log() -> Log:
    """One 2-card node: `low` (preemptible) holds a card from 0 s to 100 s and `mid` the
    other from 0 s to 10 s; `high` (priority 50, 2 cards) comes at 5 s and preempts `low` at
    10 s, when `mid` ends; `low` runs again from 30 s (when `high` ends) to 130 s."""
    log = Log()
    log.node("n1", 2)
    log.task("low", "a", 0, preemptible=True)
    log.task("mid", "b", 0)
    log.place("low", "n1", ("n1-g0",), 0)
    log.place("mid", "n1", ("n1-g1",), 0)
    log.task("high", "b", 5, gpu_required=2, priority=50)
    log.move("mid", S.COMPLETED, 10, exit_code=0)
    log.move("low", S.PREEMPTING, 10, Actor.SCHEDULER)
    log.move("low", S.PENDING, 10)
    log.place("high", "n1", ("n1-g0", "n1-g1"), 10)
    log.move("high", S.COMPLETED, 30, exit_code=0)
    log.place("low", "n1", ("n1-g0",), 30)
    log.move("low", S.COMPLETED, 130, exit_code=0)
    return log


def test_a_recorded_preemption_replays_and_preemption_off_removes_it() -> None:
    rows = preemption_log().rows
    rec = record(rows)
    assert [t.id for t in rec.tasks] == ["high", "low", "mid"]
    same = replay_report(rows, parse_sets([]))
    assert same.same_policy == (4, 4)
    lost = figures(same.replayed)[("tenant", "a")]
    assert (lost.preemptions, lost.lost_gpu_seconds) == (1, 10.0)

    off = replay_report(rows, parse_sets(["preemption=off"]))
    a, b = figures(off.replayed)[("tenant", "a")], figures(off.replayed)[("tenant", "b")]
    assert a.preemptions == 0 and a.waits == [0.0]
    # `high` waits for `low` to end by itself (100 s) instead of 5 s.
    assert sorted(b.waits) == [0.0, 95.0]


def test_a_withdrawn_task_and_a_retry_replay_as_recorded() -> None:
    log = Log()
    log.node("n1", 1)
    log.task("a1", "a", 0)
    log.place("a1", "n1", ("n1-g0",), 0)
    log.move("a1", S.FAILED, 20, exit_code=1)
    log.move("a1", S.PENDING, 25, Actor.RETRY_ENGINE)  # the retry engine's requeue, 5 s on
    log.task("w", "b", 1, gpu_required=2)  # fits nowhere: waits, then is withdrawn
    log.move("w", S.CANCELLED, 40, Actor.TENANT)
    log.place("a1", "n1", ("n1-g0",), 25)
    log.move("a1", S.COMPLETED, 35, exit_code=0)
    report = replay_report(log.rows, parse_sets(["quota.a.max_gpus=1"]))
    assert report.same_policy == (2, 2)
    view = report.view()
    assert view["withdrawn_waiting"] == {"recorded": 1, "replayed": 1}
    b = next(r for r in view["rows"] if r["name"] == "b")
    assert b["replayed"]["never_placed"] == 0 and b["replayed"]["placements"] == 0


def test_a_queue_raised_in_priority_goes_first() -> None:
    """Two queues share a 1-card node; `late`'s task waits behind `early`'s in the log.
    With `late`'s priority raised, its task goes first and `early`'s waits instead."""
    log = Log()
    pool = PoolSpec(name="all", node_selector=NodeSelector())
    log.add(pool_stream("all"), PoolCreated(spec=pool), 0)
    for name in ("early", "late"):
        q = QueueSpec(name=name, tenant="a", pools=("all",))
        log.add(queue_stream(name), QueueCreated(spec=q), 0)
    log.node("n1", 1)
    log.task("busy", "a", 0)
    log.place("busy", "n1", ("n1-g0",), 0)
    log.task("e", "a", 1, queue="early")
    log.task("l", "a", 2, queue="late")
    log.move("busy", S.COMPLETED, 10, exit_code=0)
    log.place("e", "n1", ("n1-g0",), 10)
    log.move("e", S.COMPLETED, 20, exit_code=0)
    log.place("l", "n1", ("n1-g0",), 20)
    log.move("l", S.COMPLETED, 30, exit_code=0)
    report = replay_report(log.rows, parse_sets(["queue.late.priority=900"]))
    assert report.same_policy == (3, 3)
    rows = {r["name"]: r for r in report.view()["rows"] if r["scope"] == "queue"}
    assert (rows["late"]["recorded"]["wait_p50_s"], rows["late"]["replayed"]["wait_p50_s"]) == (
        18.0,
        8.0,
    )
    assert rows["early"]["replayed"]["wait_p50_s"] == 19.0
