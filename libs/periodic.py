"""One way to run work again and again until stopped: `periodic(...)`.

Every control loop in the platform (heartbeats, monitors, purges, the group controller, the
scheduler's rounds) is "until stopped: try, log a failure, wait". Written once here, a failing
pass never ends the loop, the wait ends as soon as `stop` is set, and an optional `wake` event
cuts the wait short when there is new work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

log = structlog.get_logger(__name__)

# What one pass returns: True asks for the next pass at once (there is more work).
Pass = Callable[[], Awaitable[bool | None]]


async def wait_or_stop(
    stop: asyncio.Event, seconds: float, wake: asyncio.Event | None = None
) -> None:
    """Sleep `seconds`, returning early when `stop` (or `wake`) is set."""
    waiters = [asyncio.ensure_future(stop.wait())]
    if wake is not None:
        waiters.append(asyncio.ensure_future(wake.wait()))
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()


async def periodic(
    name: str,
    fn: Pass,
    stop: asyncio.Event,
    interval_s: float,
    *,
    wake: asyncio.Event | None = None,
    error_backoff_s: float | None = None,
) -> None:
    """Call `fn` every `interval_s` until `stop` is set.

    A pass that raises is logged as `<name>_failed` and the loop goes on after
    `error_backoff_s` (default: the interval). A pass that returns True runs again at once.
    `wake`, when given, is cleared before each wait and ends the wait when set.
    """
    while not stop.is_set():
        try:
            again = await fn()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(f"{name}_failed")
            await wait_or_stop(stop, interval_s if error_backoff_s is None else error_backoff_s)
            continue
        if again:
            continue
        if wake is not None:
            wake.clear()
        await wait_or_stop(stop, interval_s, wake)
