"""Card quarantine after a device fault, no servers: the retry decision, the node fold, the
probes that bring a card back, the scheduler's view, the agent's kernel-log reading."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from agent.device_log import KernelLog, device_lines
from agent.runtimes.base import RunSpec
from agent.runtimes.simulated import ManualClock, SimulatedRuntime
from agent.xid_events import XidWatch, ecc_counts, ecc_lines
from libs.domain.node.decide import probe_card
from libs.domain.node.events import CardQuarantined, CardRestored, NodeRegistered
from libs.domain.node.evolve import evolve_node
from libs.domain.node.model import GpuCard, Node, NodeInventory
from libs.domain.protocol import AgentReport, Fact, decide_report
from libs.domain.reasons import ReasonCode
from libs.domain.task.events import TaskRetryDecided, TaskStatusChanged
from libs.domain.task.failure import DeviceVerdict
from libs.domain.task.model import Task, TaskId, TaskSpec, TenantId
from libs.domain.task.states import TaskStatus
from services.retry_engine.decide import (
    MAX_DEVICE_REQUEUES,
    Evidence,
    NodeFacts,
    RetryConfig,
    cards_at_fault,
    decide_retry,
    device_fault,
)
from services.retry_engine.handlers.failures import quarantine_events
from services.scheduler.controllers.node_monitor import NodeMonitor
from services.scheduler.view import to_node

AT = datetime(2026, 1, 1, tzinfo=UTC)
CFG = RetryConfig(retry_delay_s=30, backoff_multiplier=2)
NODES = {"n1": NodeFacts(True, 65536, 81920, {f"n1-gpu{i}": 81920 for i in range(4)})}
FELL_OFF = "NVRM: Xid (PCI:0000:41:00): 79, pid=4242, GPU has fallen off the bus."


def failed(**kw: Any) -> Task:
    spec = TaskSpec.model_validate({"name": "t", "image": "x"} | kw.pop("spec", {}))
    return Task(
        id=TaskId("t"),
        tenant_id=TenantId("a"),
        spec=spec,
        status=TaskStatus.FAILED,
        node_id="n1",
        gpu_ids=kw.pop("gpu_ids", ("n1-gpu2",)),
        created_at=AT,
        updated_at=AT,
        **kw,
    )


def ev(**kw: Any) -> Evidence:
    base: dict[str, Any] = dict(
        exit_code=1, oom_killed=False, error_kind="", error="", output="", failed_at=AT
    )
    return Evidence(**(base | kw))


def node(*quarantined: str) -> Node:
    cards = tuple(
        GpuCard(id=f"n1-gpu{i}", index=i, vendor="nvidia", model="A100-80GB", vram_mb=81920)
        for i in range(4)
    )
    inv = NodeInventory(memory_mb=65536, cpu_cores=32, gpus=cards)
    n = evolve_node(None, NodeRegistered(node_id="n1", inventory=inv), AT, 1)
    for v, card in enumerate(quarantined, start=2):
        q = CardQuarantined(node_id="n1", gpu_id=card, code="xid:79", evidence="e", task_id="t")
        n = evolve_node(n, q, AT, v)
    return n


@pytest.mark.parametrize(
    ("task", "evidence"),
    [
        (failed(), ev(xids=(79,))),
        (failed(), ev(device_log=FELL_OFF)),
        (failed(retry_count=3), ev(xids=(48,))),  # retries spent: still the card's
        (failed(spec={"retry_strategy": "no_retry"}), ev(xids=(95,))),
    ],
    ids=["nvml-xid-79", "kernel-log-fell-off", "retries-spent", "no-retry"],
)
def test_device_fatal_requeues_at_once_without_spending_a_retry(
    task: Task, evidence: Evidence
) -> None:
    events = decide_retry(task, evidence, CFG, NODES)
    decided, move = events
    assert isinstance(decided, TaskRetryDecided) and isinstance(move, TaskStatusChanged)
    assert decided.action == "requeue" and decided.device_verdict == "device_fatal"
    assert move.to_status is TaskStatus.PENDING
    assert move.reason_code is ReasonCode.DEVICE_REQUEUE
    assert move.retry_count is None  # unchanged
    assert move.requeues == task.requeues + 1
    assert move.not_before is None and move.clear_placement
    assert not move.avoid_node_ids  # only the card is kept out, not the node


def test_app_caused_xid_is_the_users_failure_and_quarantines_nothing() -> None:
    task = failed()
    decided, move = decide_retry(task, ev(xids=(13,)), CFG, NODES)
    assert isinstance(decided, TaskRetryDecided) and isinstance(move, TaskStatusChanged)
    assert decided.action == "retry" and decided.device_verdict == "app_caused"
    assert "XID 13" in decided.device_evidence
    assert move.retry_count == 1 and move.requeues is None
    assert cards_at_fault(task, device_fault(task, ev(xids=(13,)))) == ()


def test_device_requeues_are_bounded() -> None:
    task = failed(requeues=MAX_DEVICE_REQUEUES)
    decided, move = decide_retry(task, ev(xids=(79,)), CFG, NODES)
    assert isinstance(decided, TaskRetryDecided) and isinstance(move, TaskStatusChanged)
    assert decided.action == "retry" and move.retry_count == 1


def test_cards_at_fault() -> None:
    one = failed()
    assert cards_at_fault(one, device_fault(one, ev(xids=(79,)))) == ("n1-gpu2",)
    two = failed(gpu_ids=("n1-gpu0", "n1-gpu1"))
    # A PCI id that names none of the task's cards: every card it held is suspect.
    fault = device_fault(two, ev(device_log=FELL_OFF))
    assert fault.verdict is DeviceVerdict.DEVICE_FATAL
    assert cards_at_fault(two, fault) == ("n1-gpu0", "n1-gpu1")
    cpu = failed(gpu_ids=())
    assert cards_at_fault(cpu, device_fault(cpu, ev(xids=(79,)))) == ()


def test_quarantine_events_only_for_cards_not_yet_quarantined() -> None:
    task = failed()
    fault = device_fault(task, ev(xids=(79,)))
    made = quarantine_events(node(), task, fault)
    assert [(e.gpu_id, e.code) for e in cast(list[CardQuarantined], made)] == [
        ("n1-gpu2", "xid:79")
    ]
    assert quarantine_events(node("n1-gpu2"), task, fault) == []  # a redelivery adds none


def test_fold_quarantine_and_return_and_reregistration() -> None:
    n = node("n1-gpu2")
    assert [q.gpu_id for q in n.quarantined_gpus] == ["n1-gpu2"]
    again = evolve_node(n, NodeRegistered(node_id="n1", inventory=n.inventory), AT, 9)
    assert [q.gpu_id for q in again.quarantined_gpus] == ["n1-gpu2"]  # a restart cures nothing
    back = evolve_node(n, CardRestored(node_id="n1", gpu_id="n1-gpu2", probes_passed=3), AT, 9)
    assert back.quarantined_gpus == ()


def test_scheduler_view_places_nothing_on_a_quarantined_card() -> None:
    view = to_node(node("n1-gpu2"))
    assert [g.id for g in view.gpus if g.excluded] == ["n1-gpu2"]
    assert view.online  # the node itself is not cordoned


@pytest.mark.parametrize(
    ("steps", "returned_at"),
    [
        ([(True, True)] * 3, 2),
        ([(True, True), (False, True), (True, True), (True, True), (True, True)], 4),
        ([(True, True), (True, False), (True, True)], None),
    ],
    ids=["three-passes", "a-miss-starts-again", "unhealthy-resets"],
)
def test_probe_card(steps: list[tuple[bool, bool]], returned_at: int | None) -> None:
    passed, at = 0, None
    for i, (visible, healthy) in enumerate(steps):
        passed, back = probe_card(passed, visible, healthy, 3)
        if back:
            at = i
            break
    assert at == returned_at


def test_node_monitor_probes_once_per_interval_then_restores() -> None:
    now = [0.0]
    monitor = NodeMonitor(
        cast(Any, None),
        cast(Any, None),
        clock=lambda: now[0],
        quarantine_probes=2,
        quarantine_probe_interval_s=10.0,
    )
    n = node("n1-gpu2")
    visible = {f"n1-gpu{i}" for i in range(4)}
    seen: list[list[Any]] = []
    for t in (0.0, 5.0, 10.0, 15.0, 20.0):
        now[0] = t
        seen.append(monitor.probe_quarantined(n, visible, t))
    assert [len(s) for s in seen] == [0, 0, 0, 0, 1]  # armed at 0, probes at 10 and 20
    restored = seen[-1][0]
    assert isinstance(restored, CardRestored) and restored.probes_passed == 2


def test_kernel_log_lines_written_during_the_attempt(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_text("NVRM: Xid (PCI:0000:3b:00): 79, old line before the attempt\n")
    klog = KernelLog(path)
    mark = klog.mark()
    with path.open("a") as f:
        f.write("usb 1-1: new device\n" + FELL_OFF + "\n")
    assert klog.since(mark) == [FELL_OFF]
    assert klog.since(-1) == []
    assert device_lines(["amdgpu 0000:c1:00.0: amdgpu: 3 uncorrectable hardware errors"]) != []


def test_a_failed_attempts_report_carries_its_device_evidence() -> None:
    task = failed().model_copy(update={"status": TaskStatus.RUNNING})
    report = AgentReport(
        node_id="n1",
        task_id="t",
        attempt=0,
        fact=Fact.EXITED,
        expected_status=TaskStatus.RUNNING,
        exit_code=1,
        device_log=[FELL_OFF],
        xids=[79],
        at=AT,
    )
    (changed,) = decide_report(task, report)
    assert changed.to_status is TaskStatus.FAILED
    assert changed.device_log == FELL_OFF and changed.xids == (79,)


def test_a_report_of_the_attempt_before_a_device_requeue_changes_nothing() -> None:
    # After a requeue the attempt is retry_count + requeues: the old run's report is stale.
    task = failed(requeues=1).model_copy(update={"status": TaskStatus.RUNNING})
    assert task.attempt == 1
    report = AgentReport(
        node_id="n1",
        task_id="t",
        attempt=0,
        fact=Fact.EXITED,
        expected_status=TaskStatus.RUNNING,
        exit_code=1,
        at=AT,
    )
    assert decide_report(task, report) == []


@pytest.mark.parametrize(
    ("label", "attempt", "xids", "exit_code"),
    [("79", 0, [79], 1), ("79", 1, [], 0), ("48@1", 1, [48], 1), ("", 0, [], 0)],
    ids=["first-attempt", "not-this-attempt", "named-attempt", "none"],
)
async def test_simulated_runtime_injects_an_xid(
    label: str, attempt: int, xids: list[int], exit_code: int
) -> None:
    clock = ManualClock()
    rt = SimulatedRuntime(durations=1.0, clock=clock)
    run = RunSpec.model_validate(
        {
            "task_id": "t1",
            "attempt": attempt,
            "image": "sim:latest",
            "command": "run",
            "labels": {"sim.xid": label} if label else {},
        }
    )
    handle = await rt.start(run)
    await clock.advance(1)
    report = await rt.wait(handle)
    assert (report.xids, report.exit_code) == (xids, exit_code)


class FakeNvml:
    """Just enough of pynvml's event API: card 0 posts one XID 79, then only timeouts."""

    nvmlEventTypeXidCriticalError = 8
    NVML_ERROR_TIMEOUT = 10

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            self.value = value

    def __init__(self, watch: XidWatch | None = None) -> None:
        self.pending = [SimpleNamespace(eventType=8, eventData=79, device="h0")]
        self.registered: list[str] = []
        self.watch = watch
        self.freed = False

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"h{index}"

    def nvmlDeviceRegisterEvents(self, handle: str, types: int, events: str) -> None:
        self.registered.append(handle)

    def nvmlDeviceGetUUID(self, handle: str) -> bytes:
        return f"GPU-{handle}".encode()

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> SimpleNamespace:
        if self.pending:
            return self.pending.pop()
        assert self.watch is not None
        self.watch.stop()  # the test's end: everything was read
        raise self.NVMLError(self.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, events: str) -> None:
        self.freed = True


def test_xid_watch_keeps_nvml_events_by_card() -> None:
    now = [100.0]
    watch = XidWatch(clock=lambda: now[0])
    lib = FakeNvml(watch)
    watch.nvml = lib
    watch.run()
    assert lib.registered == ["h0", "h1"] and lib.freed
    assert watch.since(["GPU-h0"], 100.0) == [79]
    assert watch.since(["GPU-h1"], 0.0) == []  # another card's event is not this task's
    assert watch.since(["GPU-h0"], 100.5) == []  # posted before the attempt started


def test_a_rise_in_uncorrectable_ecc_is_device_evidence() -> None:
    counts = {"GPU-a": 0, "GPU-b": 4}

    class EccNvml:
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
        NVML_VOLATILE_ECC = 0

        def nvmlInit(self) -> None: ...
        def nvmlShutdown(self) -> None: ...
        def nvmlDeviceGetHandleByUUID(self, card: str) -> str:
            if card not in counts:
                raise RuntimeError("not an NVML card")
            return card

        def nvmlDeviceGetTotalEccErrors(self, handle: str, kind: int, counter: int) -> int:
            assert (kind, counter) == (1, 0)
            return counts[handle]

    before = ecc_counts(["GPU-a", "GPU-b", "declared-0"], EccNvml())
    assert before == {"GPU-a": 0, "GPU-b": 4}
    counts["GPU-a"] = 2
    lines = ecc_lines(before, ecc_counts(before, EccNvml()))
    assert lines == ["NVML: GPU-a: 2 new double-bit ECC error(s)"]
    task = failed(gpu_ids=("GPU-a",))
    decided, _ = decide_retry(task, ev(device_log="\n".join(lines)), CFG, NODES)
    assert isinstance(decided, TaskRetryDecided)
    assert (decided.action, decided.failure_kind) == ("requeue", "ecc:dbe")


def test_a_device_requeue_is_placed_ahead_of_older_work_of_its_priority_class() -> None:
    from datetime import timedelta

    from services.scheduler.placement.model import (
        ClusterSnapshot,
        Gpu,
        PendingTask,
        Requirement,
    )
    from services.scheduler.placement.model import Node as PlacementNode
    from services.scheduler.placement.planner import plan

    now = datetime(2026, 1, 1, tzinfo=UTC)
    one_card = PlacementNode(
        "n1",
        True,
        gpus=(Gpu("n1-gpu0", 0, "nvidia", "A100-80GB", 80 * 1024),),
        memory_mb=64 * 1024,
        cpu_cores=16.0,
    )
    older = PendingTask("older", "acme", Requirement(gpu_count=1), created_at=now)
    requeued = PendingTask(
        "requeued",
        "acme",
        Requirement(gpu_count=1),
        created_at=now + timedelta(seconds=5),
        expedited=True,
    )
    higher = PendingTask("higher", "acme", Requirement(gpu_count=1), created_at=now, priority=5)
    snapshot = ClusterSnapshot(now=now, nodes=(one_card,))
    assert [p.task_id for p in plan(snapshot, [older, requeued]).placements] == ["requeued"]
    # Ahead of its class, not of a higher priority.
    assert [p.task_id for p in plan(snapshot, [older, requeued, higher]).placements] == ["higher"]


def test_a_pending_task_after_a_device_requeue_is_expedited() -> None:
    from services.scheduler.placement.model import PendingTask

    base = Task(
        id=TaskId("t-exp"),
        tenant_id=TenantId("acme"),
        spec=TaskSpec(name="x", image="busybox:latest", command="true"),
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        updated_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    assert not PendingTask.from_task(base).expedited
    requeued = base.model_copy(update={"status_reason_code": ReasonCode.DEVICE_REQUEUE})
    assert PendingTask.from_task(requeued).expedited
