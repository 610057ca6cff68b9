"""A runtime that runs nothing: attempts "run" for a configured time on an injectable clock.

One object is one fake node, so a benchmark can host hundreds of nodes in one process. Every
outcome (duration, exit code, OOM, start error, output) is decided from a seed and the attempt's
identity alone, so a run replays exactly however the starts interleave. Per-task overrides come
from labels:

* `sim.duration_s`      seconds the attempt runs (clock seconds);
* `sim.exit_code`       its exit code;
* `sim.oom`             "true": it ends OOM-killed (exit 137);
* `sim.needs_memory_mb` it is OOM-killed unless `memory_mb` reaches this (exercises retry
  memory doubling);
* `sim.output`          its output lines (newline-separated);
* `sim.start_error`     "<ErrorKind>[:message]": `start` raises it;
* `sim.ignore_sigterm`  "true": `stop` only ends it after the grace period (exit 137);
* `sim.xid`             "<code>[@<attempt>]": that attempt (default 0) ends with an NVIDIA
  XID as NVML would report it, exit code 1 unless `sim.exit_code` says otherwise (device
  faults and card quarantine, docs/operations.md).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, Field

from .base import (
    OUTPUT_TAIL_LINES,
    ErrorKind,
    ExitReport,
    Handle,
    HandleNotFound,
    InvalidOperation,
    RunSpec,
    RunState,
    Runtime,
    RuntimeStartError,
    tail_lines,
)

_TRUE = {"1", "true", "yes", "on"}


def _xids(label: str, attempt: int) -> tuple[int, ...]:
    """`sim.xid`: "79" (attempt 0) or "79@2" -> (79,) for that attempt, () otherwise."""
    code, _, at = label.partition("@")
    if not code.strip() or int(at or 0) != attempt:
        return ()
    return (int(code),)


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch, as this clock sees them."""
        ...

    async def sleep_until(self, when: float) -> None:
        """Return once `now() >= when` (a deadline, so no rounding error piles up)."""
        ...


class LoopClock:
    """The event loop's clock, optionally sped up (`speed=100`: a 60 s task takes 0.6 s)."""

    def __init__(self, speed: float = 1.0) -> None:
        self.speed = speed
        self._epoch = time.time()
        self._origin = time.monotonic()

    def now(self) -> float:
        return self._epoch + (time.monotonic() - self._origin) * self.speed

    async def sleep_until(self, when: float) -> None:
        # May wake a hair early (timer resolution): callers re-check `now()` and sleep again.
        await asyncio.sleep(max(0.0, when - self.now()) / self.speed)


class ManualClock:
    """Time moves only when a test calls `advance`: fully deterministic, no real waiting."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep_until(self, when: float) -> None:
        if when <= self._now:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (when, next(self._seq), fut))
        await fut  # a cancelled sleeper stays in the heap, skipped once it surfaces

    async def advance(self, seconds: float) -> None:
        """Move time forward, waking sleepers in deadline order and letting them run."""
        target = self._now + seconds
        while True:
            await _settle()
            while self._heap and self._heap[0][2].done():
                heapq.heappop(self._heap)
            if not self._heap or self._heap[0][0] > target:
                break
            deadline = self._heap[0][0]
            self._now = max(self._now, deadline)
            while self._heap and self._heap[0][0] <= deadline:
                fut = heapq.heappop(self._heap)[2]
                if not fut.done():
                    fut.set_result(None)
        self._now = target
        await _settle()


async def _settle(rounds: int = 20) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


class FailurePlan(BaseModel):
    """Seeded, fleet-wide failure rates; labels on a task override them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fail_rate: float = Field(default=0.0, ge=0, le=1)  # exits 1
    oom_rate: float = Field(default=0.0, ge=0, le=1)  # OOM-killed, exit 137
    start_error_rate: float = Field(default=0.0, ge=0, le=1)
    start_error_kind: ErrorKind = ErrorKind.CONTAINER_RUNTIME_ERROR
    missing_images: frozenset[str] = frozenset()  # start raises ImageNotFound


@dataclass
class _Outcome:
    duration_s: float
    exit_code: int
    oom: bool
    output: list[str]
    ignore_sigterm: bool
    xids: tuple[int, ...] = ()


@dataclass
class _SimTask:
    handle: Handle
    spec: RunSpec
    outcome: _Outcome
    state: RunState = RunState.RUNNING
    deadline: float = 0.0  # clock time it ends, while running
    remaining_s: float = 0.0  # time left, while paused
    report: ExitReport | None = None
    stop_code: int | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    driver: asyncio.Task[None] | None = None


class SimulatedHost:
    """What survives an agent restart on a simulated node: the attempts themselves. Give the
    same host to a new `SimulatedRuntime` to exercise re-adoption."""

    def __init__(self) -> None:
        self.tasks: dict[str, _SimTask] = {}
        self.by_attempt: dict[tuple[str, int], str] = {}  # (task_id, attempt) → handle id
        self.ids = itertools.count(1)


class SimulatedRuntime(Runtime):
    name: ClassVar[str] = "simulated"

    def __init__(
        self,
        durations: float | tuple[float, float] = 1.0,
        failure_plan: FailurePlan | None = None,
        clock: Clock | None = None,
        *,
        seed: int | str = 0,
        node_id: str = "sim",
        host: SimulatedHost | None = None,
    ) -> None:
        """`durations`: a fixed run time or a (low, high) uniform range, in clock seconds."""
        self.durations = durations
        self.plan = failure_plan or FailurePlan()
        self.clock: Clock = clock or LoopClock()
        self.seed = seed
        self.node_id = node_id
        self.host = host or SimulatedHost()

    # -- outcomes -------------------------------------------------------------------------

    def _rng(self, spec: RunSpec) -> random.Random:
        # Seeded by identity, not by call order: concurrent starts replay identically.
        return random.Random(f"{self.seed}:{self.node_id}:{spec.task_id}:{spec.attempt}")

    def _start_error(self, spec: RunSpec, rng: random.Random) -> RuntimeStartError | None:
        label = spec.labels.get("sim.start_error")
        if label:
            kind, _, msg = label.partition(":")
            return RuntimeStartError(kind, msg or "simulated start error")
        if spec.image in self.plan.missing_images:
            return RuntimeStartError(ErrorKind.IMAGE_NOT_FOUND, f"{spec.image} (simulated)")
        if rng.random() < self.plan.start_error_rate:
            return RuntimeStartError(self.plan.start_error_kind, "simulated start error")
        return None

    def _outcome(self, spec: RunSpec, rng: random.Random) -> _Outcome:
        labels = spec.labels
        if isinstance(self.durations, tuple):
            duration = rng.uniform(*self.durations)
        else:
            duration = float(self.durations)
        roll = rng.random()
        oom = roll < self.plan.oom_rate
        code = 137 if oom else 1 if roll < self.plan.oom_rate + self.plan.fail_rate else 0
        if "sim.duration_s" in labels:
            duration = float(labels["sim.duration_s"])
        if "sim.exit_code" in labels:
            code, oom = int(labels["sim.exit_code"]), False
        needs = labels.get("sim.needs_memory_mb")
        if labels.get("sim.oom", "").lower() in _TRUE or (needs and spec.memory_mb < int(needs)):
            code, oom = 137, True
        default = [f"simulated {spec.task_id} attempt {spec.attempt} on {self.node_id}"]
        output = labels["sim.output"].splitlines() if "sim.output" in labels else default
        if oom:
            output.append("Killed")
        ignore = labels.get("sim.ignore_sigterm", "").lower() in _TRUE
        xids = _xids(labels.get("sim.xid", ""), spec.attempt)
        if xids:
            code = int(labels.get("sim.exit_code", "1"))
            output.append(f"simulated NVML XID {xids[0]}")
        return _Outcome(max(0.0, duration), code, oom, output, ignore, xids)

    # -- lifecycle ------------------------------------------------------------------------

    def _task(self, handle: Handle) -> _SimTask:
        task = self.host.tasks.get(handle.id)
        if task is None:
            raise HandleNotFound(handle)
        return task

    def _finish(self, task: _SimTask, code: int, oom: bool, xids: tuple[int, ...] = ()) -> None:
        task.state = RunState.EXITED
        task.report = ExitReport(
            exit_code=code,
            oom_killed=oom,
            xids=list(xids),
            output_tail=task.outcome.output[-OUTPUT_TAIL_LINES:],
            finished_at=datetime.fromtimestamp(self.clock.now(), UTC),
        )
        task.done.set()

    async def _drive(self, task: _SimTask) -> None:
        while task.state is not RunState.EXITED:
            task.wake.clear()
            if task.stop_code is not None:
                self._finish(task, task.stop_code, False)
                return
            if task.state is RunState.PAUSED:
                await task.wake.wait()
                continue
            deadline = task.deadline
            sleeper = asyncio.ensure_future(self.clock.sleep_until(deadline))
            waker = asyncio.ensure_future(task.wake.wait())
            try:
                await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                waker.cancel()
            running = task.state is RunState.RUNNING and task.stop_code is None
            if running and task.deadline == deadline and self.clock.now() >= deadline:
                self._finish(task, task.outcome.exit_code, task.outcome.oom, task.outcome.xids)

    def _set_state(self, task: _SimTask, state: RunState) -> None:
        """Pause keeps the time left; running again moves the deadline by the pause."""
        if state is RunState.PAUSED and task.state is RunState.RUNNING:
            task.remaining_s = max(0.0, task.deadline - self.clock.now())
        elif state is RunState.RUNNING and task.state is RunState.PAUSED:
            task.deadline = self.clock.now() + task.remaining_s
        task.state = state
        task.wake.set()

    async def start(self, spec: RunSpec) -> Handle:
        existing = self.host.by_attempt.get((spec.task_id, spec.attempt))
        if existing in self.host.tasks:  # idempotent, like the real runtimes
            return self.host.tasks[existing].handle
        rng = self._rng(spec)
        error = self._start_error(spec, rng)
        if error is not None:
            raise error
        outcome = self._outcome(spec, rng)
        handle = Handle(
            runtime=self.name,
            id=f"{self.node_id}-{next(self.host.ids)}",
            task_id=spec.task_id,
            attempt=spec.attempt,
        )
        task = _SimTask(
            handle=handle,
            spec=spec,
            outcome=outcome,
            deadline=self.clock.now() + outcome.duration_s,
        )
        self.host.tasks[handle.id] = task
        self.host.by_attempt[(spec.task_id, spec.attempt)] = handle.id
        task.driver = asyncio.create_task(self._drive(task), name=f"sim-{handle.id}")
        return handle

    async def wait(self, handle: Handle) -> ExitReport:
        task = self._task(handle)
        await task.done.wait()
        assert task.report is not None
        return task.report

    async def stop(self, handle: Handle, grace_s: float = 10.0) -> None:
        task = self._task(handle)
        if task.state is RunState.EXITED:
            return
        if task.state is RunState.PAUSED:  # like the engine: thaw it so the signal lands
            self._set_state(task, RunState.RUNNING)
        if task.outcome.ignore_sigterm:
            # SIGTERM is ignored: it ends at SIGKILL, unless it finishes on its own first.
            await self._sleep_or_done(task, grace_s)
        if not task.done.is_set():
            task.stop_code = 137 if task.outcome.ignore_sigterm else 143
            task.wake.set()
            await task.done.wait()

    async def _sleep_or_done(self, task: _SimTask, seconds: float) -> None:
        sleeper = asyncio.ensure_future(self.clock.sleep_until(self.clock.now() + seconds))
        finisher = asyncio.ensure_future(task.done.wait())
        try:
            await asyncio.wait({sleeper, finisher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            finisher.cancel()

    async def _set_paused(self, handle: Handle, paused: bool) -> None:
        task = self._task(handle)
        target = RunState.PAUSED if paused else RunState.RUNNING
        if task.state is target:
            return
        if task.state is RunState.EXITED:
            raise InvalidOperation(f"cannot {'pause' if paused else 'unpause'} an exited task")
        self._set_state(task, target)
        await asyncio.sleep(0)

    async def pause(self, handle: Handle) -> None:
        await self._set_paused(handle, True)

    async def unpause(self, handle: Handle) -> None:
        await self._set_paused(handle, False)

    async def logs(self, handle: Handle, tail: int | None = None) -> list[str]:
        return tail_lines(list(self._task(handle).outcome.output), tail)

    async def follow_logs(
        self, handle: Handle, tail: int | None = None
    ) -> AsyncGenerator[str, None]:
        task = self._task(handle)
        for line in tail_lines(list(task.outcome.output), tail):
            yield line
        await task.done.wait()

    async def inspect(self, handle: Handle) -> RunState:
        task = self.host.tasks.get(handle.id)
        return RunState.MISSING if task is None else task.state

    async def list_managed(self) -> list[Handle]:
        return [t.handle for t in self.host.tasks.values()]

    async def remove(self, handle: Handle) -> None:
        task = self.host.tasks.pop(handle.id, None)
        self.host.by_attempt.pop((handle.task_id, handle.attempt), None)
        if task is not None and task.driver is not None and not task.driver.done():
            task.driver.cancel()
            if not task.done.is_set():
                task.report = ExitReport(exit_code=137, output_tail=task.outcome.output)
                task.state = RunState.EXITED
                task.done.set()

    async def close(self) -> None:
        for task in self.host.tasks.values():
            if task.driver is not None:
                task.driver.cancel()
