"""The runtime contract: the cases every `Runtime` must pass, written once.

A runtime's suite subclasses `RuntimeContract` (the way pyeventsourcing runs one recorder
suite over every adapter) and says how to make one (`make_runtime`), how a behaviour is
spelled for it (`spec`: a shell script for the docker and process runtimes, labels for the
simulated one) and what it cannot do (the capability flags). Cases only one runtime can
express stay in that runtime's subclass.

Times are read from the runtime's own clock (`now`): the simulated runtime may run on a
sped-up clock, and a grace period is measured in the seconds the runtime itself counts.
"""

from __future__ import annotations

import asyncio
import shlex
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from agent.runtimes.base import (
    ErrorKind,
    Handle,
    HandleNotFound,
    InvalidOperation,
    RunSpec,
    RunState,
    Runtime,
    RuntimeStartError,
)
from tests.wait import wait_until_async

LONG_S = 30.0  # "runs until stopped": far longer than any case waits


def shell_script(
    prints: Sequence[str],
    *,
    exit_code: int = 0,
    runs_s: float = 0.0,
    gap_s: float = 0.0,
    ignores_term: bool = False,
    last_newline: bool = True,
) -> str:
    """The shell spelling of a behaviour, for runtimes that run real commands."""
    steps: list[str] = ["trap '' TERM"] if ignores_term else []
    for i, line in enumerate(prints):
        if i and gap_s:
            steps.append(f"sleep {gap_s:g}")
        last = i == len(prints) - 1
        fmt = "'%s'" if last and not last_newline else "'%s\\n'"
        steps.append(f"printf {fmt} {shlex.quote(line)}")
    if runs_s:
        steps.append(f"sleep {runs_s:g}")
    steps.append(f"exit {exit_code}")
    return "; ".join(steps)


BEHAVIOUR = frozenset({"exit_code", "runs_s", "gap_s", "ignores_term", "last_newline"})


def split_behaviour(kw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`spec`'s keywords as (the behaviour, the remaining RunSpec fields)."""
    behaviour = {k: v for k, v in kw.items() if k in BEHAVIOUR}
    return behaviour, {k: v for k, v in kw.items() if k not in BEHAVIOUR}


class RuntimeContract:
    """Shared cases; a subclass named `Test...` makes pytest run them against its runtime."""

    #: the runtime's images are real: a missing one is refused at start
    has_images: ClassVar[bool] = True
    #: bind mounts are checked at start
    mounts_volumes: ClassVar[bool] = True
    #: `follow_logs` yields each line as the task writes it (not all lines at once)
    streams_logs: ClassVar[bool] = True
    #: a stop whose SIGTERM is obeyed returns within this many runtime seconds
    term_stop_within_s: ClassVar[float] = 3.0
    #: how far past the grace a SIGKILL may land, in runtime seconds
    kill_slack_s: ClassVar[float] = 5.0

    # -- hooks ----------------------------------------------------------------------------

    def make_runtime(self, tmp_path: Path) -> Runtime:
        raise NotImplementedError

    def make_restarted(self, rt: Runtime) -> Runtime:
        """A new runtime over the same node, as a restarted agent builds it."""
        raise NotImplementedError

    def task_id(self) -> str:
        return f"c{uuid.uuid4().hex[:10]}"

    def spec(
        self,
        prints: Sequence[str] = (),
        *,
        exit_code: int = 0,
        runs_s: float = 0.0,
        gap_s: float = 0.0,
        ignores_term: bool = False,
        last_newline: bool = True,
        **fields: Any,
    ) -> RunSpec:
        """A task that prints `prints` (`gap_s` apart), runs `runs_s` more, exits `exit_code`;
        `ignores_term`: SIGTERM does not end it. `fields` are further RunSpec fields."""
        raise NotImplementedError

    def missing_image(self) -> str:
        """An image this runtime does not have (only asked when `has_images`)."""
        raise NotImplementedError

    def now(self, rt: Runtime) -> float:
        return time.monotonic()

    async def frozen(self, rt: Runtime, h: Handle) -> bool:
        """Whether the task is really stopped (the node's own evidence, not `inspect`)."""
        return await rt.inspect(h) is RunState.PAUSED

    async def check_removed(self, rt: Runtime, spec: RunSpec, h: Handle) -> None:
        """What else `remove` must have cleared on this runtime (files, processes)."""

    async def dispose(self, rt: Runtime) -> None:
        for handle in await rt.list_managed():  # never leave a task behind
            await rt.remove(handle)
        await rt.close()

    @pytest.fixture
    async def rt(self, tmp_path: Path) -> AsyncIterator[Runtime]:
        runtime = self.make_runtime(tmp_path)
        try:
            yield runtime
        finally:
            await self.dispose(runtime)

    async def running(self, rt: Runtime, **kw: Any) -> Handle:
        """Start a long task and return once it runs (its traps set: it has said "ready")."""
        h = await rt.start(self.spec(["ready"], runs_s=LONG_S, **kw))
        await wait_until_async(
            lambda: self._said_ready(rt, h), 10, message=f"{h.task_id} said ready"
        )
        return h

    @staticmethod
    async def _said_ready(rt: Runtime, h: Handle) -> bool:
        return "ready" in await rt.logs(h)

    # -- the cases ------------------------------------------------------------------------

    async def test_exit_zero_and_logs_stay_readable(self, rt: Runtime) -> None:
        h = await rt.start(self.spec(["hello", "world"]))
        report = await rt.wait(h)
        assert report.exit_code == 0 and report.succeeded and not report.oom_killed
        assert report.output_tail == ["hello", "world"]
        assert await rt.inspect(h) is RunState.EXITED  # not removed by its exit
        assert await rt.logs(h) == ["hello", "world"]
        assert await rt.logs(h, tail=1) == ["world"]
        assert await rt.logs(h, tail=0) == []

    async def test_exit_code_is_captured(self, rt: Runtime) -> None:
        report = await rt.wait(await rt.start(self.spec(exit_code=3)))
        assert report.exit_code == 3 and not report.succeeded and not report.oom_killed

    async def test_pause_and_unpause_are_idempotent(self, rt: Runtime) -> None:
        h = await self.running(rt)
        await rt.pause(h)
        await rt.pause(h)
        assert await rt.inspect(h) is RunState.PAUSED
        await wait_until_async(lambda: self.frozen(rt, h), 5, message="the task stopped")
        await rt.unpause(h)
        await rt.unpause(h)
        assert await rt.inspect(h) is RunState.RUNNING
        assert not await self.frozen(rt, h)
        await rt.stop(h, grace_s=2)
        with pytest.raises(InvalidOperation):
            await rt.pause(h)

    async def test_stop_sends_sigterm_first(self, rt: Runtime) -> None:
        h = await self.running(rt)
        t0 = self.now(rt)
        await rt.stop(h, grace_s=5)
        assert self.now(rt) - t0 < self.term_stop_within_s  # it obeyed: no grace waited
        assert (await rt.wait(h)).exit_code == 143
        await rt.stop(h)  # already ended: nothing to do

    async def test_stop_of_a_task_ignoring_sigterm_waits_the_grace(self, rt: Runtime) -> None:
        h = await self.running(rt, ignores_term=True)
        t0 = self.now(rt)
        await rt.stop(h, grace_s=1)
        assert 0.8 < self.now(rt) - t0 < 1 + self.kill_slack_s
        assert (await rt.wait(h)).exit_code == 137
        with pytest.raises(InvalidOperation):
            await rt.pause(h)

    async def test_stop_of_a_paused_task(self, rt: Runtime) -> None:
        h = await self.running(rt)
        await rt.pause(h)
        await rt.stop(h, grace_s=5)
        assert (await rt.wait(h)).exit_code == 143

    async def test_start_is_idempotent_and_remove_forgets_the_attempt(self, rt: Runtime) -> None:
        s = self.spec(runs_s=LONG_S)
        h = await rt.start(s)
        assert await rt.start(s) == h  # a redelivered start
        await rt.remove(h)  # a running task: killed
        await rt.remove(h)  # idempotent
        assert await rt.inspect(h) is RunState.MISSING
        with pytest.raises(HandleNotFound):
            await rt.wait(h)
        await self.check_removed(rt, s, h)
        again = await rt.start(s)  # the attempt may run afresh
        assert again.id != h.id

    async def test_a_restarted_agent_readopts_its_attempts(self, rt: Runtime) -> None:
        s = self.spec(["finished"], runs_s=1, exit_code=4, attempt=2)
        h = await rt.start(s)
        fresh = self.make_restarted(rt)
        try:
            found = [x for x in await fresh.list_managed() if x.task_id == s.task_id]
            assert found == [h] and found[0].attempt == 2
            report = await fresh.wait(found[0])
            assert report.exit_code == 4 and report.output_tail == ["finished"]
        finally:
            await fresh.close()

    async def test_follow_logs_yields_lines_until_the_end(self, rt: Runtime) -> None:
        # The last line has no newline: it still counts once the task ends.
        s = self.spec(["one", "two", "three"], gap_s=1.0, last_newline=False)
        h = await rt.start(s)
        seen: list[tuple[str, RunState]] = []
        async for line in rt.follow_logs(h):
            seen.append((line, await rt.inspect(h)))
        assert [line for line, _ in seen] == ["one", "two", "three"]
        assert await rt.inspect(h) is RunState.EXITED  # the stream ended with the task
        if self.streams_logs:
            # Streamed, not read at the end: the first line came while the task still ran (it
            # runs 2 s after it). Causal, not timed: a late attach replays "one" at once.
            assert seen[0][1] is RunState.RUNNING, seen
        assert [line async for line in rt.follow_logs(h, tail=1)] == ["three"]

    async def test_follow_logs_can_be_abandoned(self, rt: Runtime) -> None:
        h = await self.running(rt)
        stream = rt.follow_logs(h)
        assert await asyncio.wait_for(anext(stream), 5) == "ready"
        await stream.aclose()  # the runtime lets go of the stream
        await rt.stop(h, grace_s=1)
        assert (await asyncio.wait_for(rt.wait(h), 10)).exit_code == 143

    async def test_cancelled_wait_leaves_nothing_blocked(self, rt: Runtime) -> None:
        h = await self.running(rt)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(rt.wait(h), 0.3)
        await rt.stop(h, grace_s=1)
        assert (await asyncio.wait_for(rt.wait(h), 5)).exit_code == 143

    async def test_a_missing_image_is_image_not_found(self, rt: Runtime) -> None:
        if not self.has_images:
            pytest.skip(f"{type(rt).__name__} runs no images")
        s = self.spec(image=self.missing_image())
        with pytest.raises(RuntimeStartError) as err:
            await rt.start(s)
        assert err.value.kind is ErrorKind.IMAGE_NOT_FOUND
        assert [h for h in await rt.list_managed() if h.task_id == s.task_id] == []

    async def test_a_missing_volume_is_invalid_config(self, rt: Runtime) -> None:
        if not self.mounts_volumes:
            pytest.skip(f"{type(rt).__name__} mounts no volumes")
        missing = f"/no/such/{uuid.uuid4().hex[:8]}"
        s = self.spec(volumes=[{"host_path": missing, "container_path": missing}])
        with pytest.raises(RuntimeStartError) as err:
            await rt.start(s)
        assert err.value.kind is ErrorKind.INVALID_CONFIG
