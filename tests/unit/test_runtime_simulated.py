"""The simulated runtime: the runtime contract on a sped-up clock, and its own cases
(deterministic outcomes on a manual clock)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agent.runtimes import RunSpec, RunState
from agent.runtimes.base import (
    ErrorKind,
    InvalidOperation,
    Runtime,
    RuntimeStartError,
)
from agent.runtimes.simulated import (
    FailurePlan,
    LoopClock,
    ManualClock,
    SimulatedHost,
    SimulatedRuntime,
)
from tests.contract.runtime import RuntimeContract, split_behaviour

MISSING_IMAGE = "gone:1"
SPEED = 5.0  # the contract's cases on a loop clock 5x real time: a 1 s grace takes 0.2 s


class TestSimulatedRuntime(RuntimeContract):
    mounts_volumes = False
    streams_logs = False  # its output is known at start: all lines come at once

    def make_runtime(self, tmp_path: Path) -> Runtime:
        plan = FailurePlan(missing_images=frozenset({MISSING_IMAGE}))
        return SimulatedRuntime(failure_plan=plan, clock=LoopClock(speed=SPEED))

    def make_restarted(self, rt: Runtime) -> Runtime:
        assert isinstance(rt, SimulatedRuntime)
        return SimulatedRuntime(clock=rt.clock, host=rt.host, node_id=rt.node_id)

    def spec(self, prints: Sequence[str] = (), **kw: Any) -> RunSpec:
        b, fields = split_behaviour(kw)
        lines = list(prints)
        duration = b.get("gap_s", 0.0) * max(0, len(lines) - 1) + b.get("runs_s", 0.0)
        labels = {"sim.duration_s": str(duration), "sim.exit_code": str(b.get("exit_code", 0))}
        if lines:
            labels["sim.output"] = "\n".join(lines)
        if b.get("ignores_term"):
            labels["sim.ignore_sigterm"] = "true"
        fields["labels"] = {**labels, **fields.get("labels", {})}
        return spec(self.task_id(), **fields)

    def missing_image(self) -> str:
        return MISSING_IMAGE

    def now(self, rt: Runtime) -> float:
        assert isinstance(rt, SimulatedRuntime)
        return rt.clock.now()


def spec(task_id: str = "t1", attempt: int = 0, **kw: object) -> RunSpec:
    return RunSpec.model_validate(
        {"task_id": task_id, "attempt": attempt, "image": "sim:latest", "command": "run", **kw}
    )


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


async def test_completes_after_its_duration(clock: ManualClock) -> None:
    rt = SimulatedRuntime(durations=30.0, clock=clock)
    h = await rt.start(spec())
    assert await rt.inspect(h) is RunState.RUNNING
    await clock.advance(29)
    assert await rt.inspect(h) is RunState.RUNNING
    await clock.advance(1)
    assert await rt.inspect(h) is RunState.EXITED
    report = await rt.wait(h)
    assert report.exit_code == 0 and not report.oom_killed and report.succeeded
    assert report.finished_at.timestamp() == pytest.approx(clock.now())
    assert report.output_tail == ["simulated t1 attempt 0 on sim"]


@pytest.mark.parametrize(
    ("labels", "memory_mb", "exit_code", "oom"),
    [
        ({"sim.exit_code": "3"}, 2048, 3, False),
        ({"sim.oom": "true"}, 2048, 137, True),
        ({"sim.needs_memory_mb": "4096"}, 2048, 137, True),
        ({"sim.needs_memory_mb": "4096"}, 4096, 0, False),
        ({}, 2048, 0, False),
    ],
    ids=["exit-code", "oom", "needs-more-memory", "memory-enough", "default"],
)
async def test_label_overrides(
    clock: ManualClock, labels: dict[str, str], memory_mb: int, exit_code: int, oom: bool
) -> None:
    rt = SimulatedRuntime(durations=5.0, clock=clock)
    h = await rt.start(spec(labels={"sim.duration_s": "2", **labels}, memory_mb=memory_mb))
    await clock.advance(2)
    report = await rt.wait(h)
    assert (report.exit_code, report.oom_killed) == (exit_code, oom)


@pytest.mark.parametrize(
    ("labels", "plan", "image", "kind"),
    [
        (
            {"sim.start_error": "PermissionDenied:no"},
            FailurePlan(),
            "sim:latest",
            "PermissionDenied",
        ),
        ({}, FailurePlan(start_error_rate=1.0), "sim:latest", "ContainerRuntimeError"),
    ],
    ids=["label", "rate"],  # missing-image: the contract's
)
async def test_start_errors(
    clock: ManualClock, labels: dict[str, str], plan: FailurePlan, image: str, kind: str
) -> None:
    rt = SimulatedRuntime(failure_plan=plan, clock=clock)
    with pytest.raises(RuntimeStartError) as err:
        await rt.start(spec(labels=labels, image=image))
    assert err.value.kind is ErrorKind(kind)
    assert await rt.list_managed() == []


async def test_pause_freezes_the_remaining_time(clock: ManualClock) -> None:
    rt = SimulatedRuntime(durations=10.0, clock=clock)
    h = await rt.start(spec())
    await clock.advance(4)
    await rt.pause(h)
    await rt.pause(h)  # idempotent
    assert await rt.inspect(h) is RunState.PAUSED
    await clock.advance(100)
    assert await rt.inspect(h) is RunState.PAUSED
    await rt.unpause(h)
    await rt.unpause(h)  # idempotent
    await clock.advance(5.5)
    assert await rt.inspect(h) is RunState.RUNNING
    await clock.advance(0.5)
    assert await rt.inspect(h) is RunState.EXITED
    with pytest.raises(InvalidOperation):
        await rt.pause(h)


async def test_outcomes_replay_from_the_seed() -> None:
    plan = FailurePlan(fail_rate=0.3, oom_rate=0.2)

    async def run(seed: int, order: list[int]) -> dict[str, tuple[int | None, bool]]:
        clock = ManualClock()
        rt = SimulatedRuntime(durations=(1.0, 50.0), failure_plan=plan, clock=clock, seed=seed)
        handles = [await rt.start(spec(f"t{i}")) for i in order]
        await clock.advance(50)
        reports = {h.task_id: await rt.wait(h) for h in handles}
        return {k: (r.exit_code, r.oom_killed) for k, r in sorted(reports.items())}

    first = await run(7, list(range(40)))
    assert first == await run(7, list(reversed(range(40))))  # start order does not matter
    assert first != await run(8, list(range(40)))
    codes = [code for code, _ in first.values()]
    assert {0, 1, 137} <= set(codes)


async def test_a_restart_readopts_every_attempt_and_remove_keeps_the_others(
    clock: ManualClock,
) -> None:
    host = SimulatedHost()
    rt = SimulatedRuntime(durations=10.0, clock=clock, host=host, node_id="n1")
    h = await rt.start(spec("a"))
    h2 = await rt.start(spec("a", attempt=1))
    # "restart the agent": a new runtime object over the same node
    again = SimulatedRuntime(durations=10.0, clock=clock, host=host, node_id="n1")
    assert {(x.task_id, x.attempt) for x in await again.list_managed()} == {("a", 0), ("a", 1)}
    await clock.advance(10)
    assert (await again.wait(h)).exit_code == 0
    await again.remove(h)
    assert [x.id for x in await again.list_managed()] == [h2.id]


async def test_remove_of_a_running_task_releases_its_waiter(clock: ManualClock) -> None:
    rt = SimulatedRuntime(durations=100.0, clock=clock)
    h = await rt.start(spec())
    waiter = asyncio.ensure_future(rt.wait(h))
    await asyncio.sleep(0)
    await rt.remove(h)
    assert (await waiter).exit_code == 137


async def test_many_nodes_on_a_fast_loop_clock() -> None:
    clock = LoopClock(speed=1000.0)  # a 5 s task takes 5 ms
    nodes = [SimulatedRuntime(durations=5.0, clock=clock, node_id=f"n{i}") for i in range(50)]
    handles = [(rt, await rt.start(spec(f"t{j}"))) for rt in nodes for j in range(20)]
    reports = await asyncio.wait_for(asyncio.gather(*(rt.wait(h) for rt, h in handles)), 10)
    assert len(reports) == 1000 and all(r.exit_code == 0 for r in reports)
    for rt in nodes:
        await rt.close()
