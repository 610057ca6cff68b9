"""The one way a test waits for something: poll a predicate until it holds or time runs out.

`wait_until` for plain code and `wait_until_async` inside a coroutine (its predicate may be a
coroutine function). Both return the predicate's first truthy value, so a test can wait for a
thing and use it (`row = await wait_until_async(lambda: store.get(id), 5, message="row")`),
and both fail with `message` and the last value seen: a timeout says what never happened.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_INTERVAL_S = 0.05


class WaitTimeout(AssertionError):
    """The predicate never held within the timeout (an AssertionError: a failed test)."""


Message = str | Callable[[], object]


def _failure(message: Message, timeout: float, last: object) -> WaitTimeout:
    text = message() if callable(message) else message
    return WaitTimeout(f"{text or 'condition'} not met within {timeout:g} s (last: {last!r})")


def wait_until(
    predicate: Callable[[], T | None],
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = DEFAULT_INTERVAL_S,
    message: Message = "",
) -> T:
    """Call `predicate` every `interval` s until it returns a truthy value, and return that;
    raise `WaitTimeout` once `timeout` s have passed (it is always tried at least once).
    `message` may be a function: it is called only on a timeout (to add a log, a state)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _failure(message, timeout, value)
        time.sleep(interval)


@overload
async def wait_until_async(
    predicate: Callable[[], Awaitable[T | None]],
    timeout: float = ...,  # noqa: ASYNC109 - the same signature as wait_until
    interval: float = ...,
    message: Message = ...,
) -> T: ...


@overload
async def wait_until_async(
    predicate: Callable[[], T | None],
    timeout: float = ...,  # noqa: ASYNC109
    interval: float = ...,
    message: Message = ...,
) -> T: ...


async def wait_until_async(
    predicate: Callable[[], Any],
    timeout: float = DEFAULT_TIMEOUT_S,  # noqa: ASYNC109 - the same signature as wait_until
    interval: float = DEFAULT_INTERVAL_S,
    message: Message = "",
) -> Any:
    """`wait_until` for a coroutine: the loop keeps running between tries, and a predicate
    that returns an awaitable is awaited."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _failure(message, timeout, value)
        await asyncio.sleep(interval)
