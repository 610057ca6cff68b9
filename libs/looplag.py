"""Event-loop lag: how late the loop runs a callback, and which call held it.

Every process runs one `LoopLagMonitor`. A watchdog thread posts a no-op callback to the loop
every `interval_s` and times how long the loop takes to run it. The lag goes into the
`heteroflow_event_loop_lag_seconds` histogram. When a callback has not run after `warn_s`, the
loop is blocked *right now*, so the watchdog takes the loop thread's stack at that moment: the
warning it logs names the call that blocks (file, line, function), which is what one needs to
fix it. asyncio's own debug mode only names the handle, and only after the fact.

A thread is the only observer that can see a blocked loop: a coroutine sampler would itself
wait for the blocking call to return.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator

import structlog
from prometheus_client import Histogram

log = structlog.get_logger(__name__)

LOOP_LAG = Histogram(
    "heteroflow_event_loop_lag_seconds",
    "How late the event loop ran a callback posted by the lag watchdog",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)

_STACK_FRAMES = 40
_LIBRARIES = ("site-packages", "/lib/python3")


def _stack_of(thread_id: int) -> list[str]:
    """The innermost frames of a thread, as `file:line in function` lines."""
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return []
    summary = traceback.extract_stack(frame)[-_STACK_FRAMES:]
    return [f"{f.filename}:{f.lineno} in {f.name}" for f in summary]


def _own_frame(stack: list[str]) -> str:
    """The innermost frame of our own code: the call to fix, below it only libraries."""
    for line in reversed(stack):
        if not any(part in line for part in _LIBRARIES):
            return line
    return stack[-1] if stack else ""


class LoopLagMonitor:
    """Watchdog thread measuring the lag of one event loop; start() from inside that loop."""

    def __init__(self, interval_s: float = 0.1, warn_s: float = 0.25, name: str = "") -> None:
        self.interval_s = interval_s
        self.warn_s = warn_s
        self.name = name
        self.max_lag_s = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> LoopLagMonitor:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._thread = threading.Thread(target=self._watch, name="hf-loop-lag", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _watch(self) -> None:
        assert self._loop is not None
        while not self._stop.wait(self.interval_s):
            ran = threading.Event()
            posted = time.perf_counter()
            try:
                self._loop.call_soon_threadsafe(ran.set)
            except RuntimeError:  # the loop is closed: nothing left to watch
                return
            stack: list[str] = []
            if not ran.wait(self.warn_s):
                stack = _stack_of(self._loop_thread)  # taken while the loop is still blocked
                while not ran.wait(0.5):
                    if self._stop.is_set() or self._loop.is_closed():
                        return
            lag = time.perf_counter() - posted
            LOOP_LAG.observe(lag)
            self.max_lag_s = max(self.max_lag_s, lag)
            if stack:
                log.warning(
                    "event_loop_stalled",
                    process=self.name,
                    lag_s=round(lag, 3),
                    blocking_call=_own_frame(stack),
                    innermost=stack[-1] if stack else "",
                    stack=stack,
                )


@contextlib.asynccontextmanager
async def watch_loop(
    name: str, interval_s: float = 0.1, warn_s: float = 0.25
) -> AsyncIterator[LoopLagMonitor]:
    """`async with watch_loop("scheduler"):` measures this loop's lag while the block runs."""
    monitor = LoopLagMonitor(interval_s, warn_s, name).start()
    try:
        yield monitor
    finally:
        monitor.stop()
