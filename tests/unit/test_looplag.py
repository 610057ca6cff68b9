"""The loop-lag watchdog measures a blocked loop and names the call that blocks it."""

from __future__ import annotations

import asyncio
import time

from structlog.testing import capture_logs

from libs.looplag import LOOP_LAG, LoopLagMonitor


def _lag_count() -> float:
    for metric in LOOP_LAG.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count"):
                return sample.value
    return 0.0


def _blocking_call_under_test(seconds: float) -> None:
    time.sleep(seconds)  # the kind of call that must never run on the loop


async def test_a_blocked_loop_is_measured_and_the_blocking_call_named() -> None:
    before = _lag_count()
    with capture_logs() as logs:
        monitor = LoopLagMonitor(interval_s=0.02, warn_s=0.1, name="unit").start()
        try:
            await asyncio.sleep(0.1)  # let it take a few quiet samples
            _blocking_call_under_test(0.4)
            for _ in range(50):  # the watchdog logs once the loop runs its callback again
                if any(e["event"] == "event_loop_stalled" for e in logs):
                    break
                await asyncio.sleep(0.02)
        finally:
            monitor.stop()
    stalls = [e for e in logs if e["event"] == "event_loop_stalled"]
    assert len(stalls) == 1, logs
    assert stalls[0]["lag_s"] >= 0.3
    assert "_blocking_call_under_test" in stalls[0]["blocking_call"]
    assert monitor.max_lag_s >= 0.3
    assert _lag_count() > before + 3


async def test_a_quiet_loop_logs_nothing() -> None:
    with capture_logs() as logs:
        monitor = LoopLagMonitor(interval_s=0.02, warn_s=0.25, name="unit").start()
        try:
            await asyncio.sleep(0.3)
        finally:
            monitor.stop()
    assert not [e for e in logs if e["event"] == "event_loop_stalled"]
    assert monitor.max_lag_s < 0.25
