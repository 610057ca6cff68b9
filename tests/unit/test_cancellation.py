"""`asyncio.wait_for` keeps a cancellation that meets a ready result (libs/cancellation.py)."""

from __future__ import annotations

import asyncio
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
