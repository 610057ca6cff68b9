"""Cancellation that is not lost: Python 3.12's `asyncio.wait_for` on Python 3.11.

On 3.11, `wait_for` returns the awaited result when that result is ready in the same loop
iteration as a cancellation of the waiting task: the cancellation is dropped (cpython
gh-86296, fixed in 3.12 by writing `wait_for` over `asyncio.timeout`). A task told to stop
then runs on. Here it left a bus consumer fetching, or a controller's term running, after
the platform was told to stop, and the stop waited out its 20 s bound: the stop's
cancellation reached a pull loop's `next_msg` (nats-py) or a pool's wait for a connection
(psycopg_pool) just as a message or a connection arrived, and both wait through
`asyncio.wait_for`.

`cancel_and_wait(task)` is the targeted remedy: it cancels a task and cancels it again, every
`again_every_s`, while it still runs (the leader lease's term, libs/bus/lease.py; the pull
loops end on a flag as well, libs/bus/pull.py).

`install()` puts the 3.12 implementation in its place on 3.11, for the libraries too: they
call it as `asyncio.wait_for`. On 3.12 and later it does nothing. It is not run (see
libs/__init__.py): installed for every library it changed more than the stop path.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from typing import Any, TypeVar

import structlog

log = structlog.get_logger(__name__)

T = TypeVar("T")

# The interpreter's own, kept for comparison (tests/unit/test_cancellation.py).
ORIGINAL = asyncio.wait_for


async def wait_for(fut: Awaitable[T], timeout: float | None) -> T:  # noqa: ASYNC109 - its signature
    """`asyncio.wait_for` as Python 3.12 has it: a cancellation of the caller always
    raises `CancelledError`; past `timeout`, `fut` is cancelled and `TimeoutError` raised."""
    if timeout is not None and timeout <= 0:
        future = asyncio.ensure_future(fut)
        if future.done():
            return future.result()
        await _cancel_and_wait(future)
        try:
            return future.result()
        except asyncio.CancelledError as exc:
            raise TimeoutError from exc
    async with asyncio.timeout(timeout):
        return await fut


async def cancel_and_wait(task: asyncio.Task[Any], *, again_every_s: float = 2.0) -> None:
    """Cancel `task` and wait until it has ended, cancelling it again every `again_every_s`
    while it runs on (a cancellation dropped by 3.11's `wait_for`). Its result or error is
    left in the task."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=again_every_s)
        if not task.done():
            log.warning("cancellation_lost", task=task.get_name(), again_after_s=again_every_s)


async def _cancel_and_wait(future: asyncio.Future[Any]) -> None:
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def release(_: asyncio.Future[Any]) -> None:
        if not waiter.done():
            waiter.set_result(None)

    future.add_done_callback(release)
    try:
        future.cancel()
        await waiter
    finally:
        future.remove_done_callback(release)


def install() -> None:
    """Use `wait_for` as `asyncio.wait_for` where the interpreter's own loses cancellations."""
    if sys.version_info < (3, 12) and asyncio.wait_for is ORIGINAL:
        asyncio.wait_for = wait_for  # type: ignore[assignment]
        asyncio.tasks.wait_for = wait_for  # type: ignore[assignment]


__all__ = ["ORIGINAL", "cancel_and_wait", "install", "wait_for"]
