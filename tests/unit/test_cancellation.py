"""`asyncio.wait_for` keeps a cancellation that meets a ready result (libs/cancellation.py)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from libs import cancellation

WaitFor = Callable[[Awaitable[Any], float | None], Awaitable[Any]]


async def cancelled_as_its_item_arrives(wait_for: WaitFor) -> tuple[bool, Any]:
    """(cancelled, result) of a task waiting on a queue through `wait_for`, cancelled in
    the loop iteration its item arrives in (a stop meeting a message)."""
    queue: asyncio.Queue[str] = asyncio.Queue()

    async def getter() -> str:
        return str(await wait_for(queue.get(), 5.0))

    task = asyncio.create_task(getter())
    await asyncio.sleep(0)  # the task now waits in wait_for
    queue.put_nowait("message")
    task.cancel()
    try:
        return False, await task
    except asyncio.CancelledError:
        return True, None


async def test_the_replacement_keeps_the_cancellation() -> None:
    assert await cancelled_as_its_item_arrives(cancellation.wait_for) == (True, None)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12's own wait_for keeps it")
async def test_the_interpreters_own_wait_for_loses_it_on_3_11() -> None:
    assert asyncio.wait_for is cancellation.ORIGINAL  # not installed (libs/__init__.py)
    assert await cancelled_as_its_item_arrives(cancellation.ORIGINAL) == (False, "message")


async def test_results_timeouts_and_a_timeout_of_zero() -> None:
    async def value(after_s: float) -> str:
        await asyncio.sleep(after_s)
        return "done"

    assert await cancellation.wait_for(value(0), 1.0) == "done"
    assert await cancellation.wait_for(value(0), None) == "done"

    inner = asyncio.create_task(value(10))
    with pytest.raises(TimeoutError):
        await cancellation.wait_for(inner, 0.01)
    assert inner.cancelled()  # past the timeout the awaited work is cancelled

    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    ready.set_result("ready")
    assert await cancellation.wait_for(ready, 0) == "ready"
    pending = asyncio.create_task(value(10))
    with pytest.raises(TimeoutError):
        await cancellation.wait_for(pending, 0)
    assert pending.cancelled()


async def test_cancel_and_wait_cancels_again_a_task_that_lost_the_first() -> None:
    lost: list[bool] = []

    async def runs_on() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            lost.append(True)  # as 3.11's wait_for does when a result is ready
        await asyncio.sleep(10)

    task = asyncio.create_task(runs_on())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancellation.cancel_and_wait(task, again_every_s=0.05), 5.0)
    assert lost == [True] and task.cancelled()


async def test_a_stopped_pull_loop_ends_though_its_cancellation_was_lost() -> None:
    from libs.bus.pull import PullLoop

    handed: list[list[Any]] = []

    async def consume(messages: list[Any]) -> None:
        handed.append(messages)

    class Loop(PullLoop):
        fetching = asyncio.Event()

        async def open(self) -> None:
            pass

        async def _close(self) -> None:
            pass

        async def _fetch(self) -> list[Any]:
            self.fetching.set()
            # A message arrived as the cancellation did: 3.11's wait_for drops the latter.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(10)
            return ["message"]

    loop = Loop(None, "S", "d", consume, batch=1)  # type: ignore[arg-type]
    task = asyncio.create_task(loop.run())
    await loop.fetching.wait()
    loop.stop(task)
    await asyncio.wait_for(task, 5.0)  # ends, not fetching again
    assert handed == []  # the message fetched while stopping is left to be redelivered
