"""The router's figures under steady load: a bounded cost, published at the interval.

Both once stalled a gateway worker's event loop: every request a second after the last
publish published again (so about once a second under load), and each publish sorted every
latency of the last minute (600,000 at 10,000 requests/s: ~0.5 s of CPU each time), which
took c=64 through /serve/ from ~10,000 to ~2,500 requests/s with a ~1 s p99.
"""

from __future__ import annotations

import asyncio
import builtins
from typing import Any, cast

import pytest

import libs.domain.group.serving as figures_module
from libs.config import GatewaySettings
from libs.domain.group.serving import Replica, RequestWindow, ServingSpec
from services.api_gateway.serving import ServingRouter, Target


def test_the_figures_sort_a_bounded_sample_of_a_busy_minute(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sorts: list[int] = []

    def counting_sorted(values: Any, *args: Any, **kwargs: Any) -> list[Any]:
        out = builtins.sorted(values, *args, **kwargs)
        sorts.append(len(out))
        return out

    monkeypatch.setattr(figures_module, "sorted", counting_sorted, raising=False)
    w = RequestWindow(window_s=60.0)
    n = 200_000  # a minute at ~3,300 requests/s; latencies 1..10 ms, p95 9.5 ms
    for i in range(n):
        w.finished(now=i * 60.0 / n, latency_s=0.001 + 0.009 * ((i * 7919) % n) / n)
    f = w.figures(now=60.0)
    assert f["requests_per_second"] == pytest.approx(n / 60.0, rel=1e-3)
    assert f["latency_p95_ms"] == pytest.approx(9.55, rel=0.03)
    assert sorts and max(sorts) <= 60 * 128, f"sorted {max(sorts)} latencies for one p95"


def test_the_window_is_exact_while_seconds_are_small() -> None:
    w = RequestWindow(window_s=10)
    for i in range(100):
        w.finished(now=i / 10, latency_s=0.001 * (100 - i))
    f = w.figures(now=10.0)
    assert f["requests_per_second"] == pytest.approx(10.0)
    assert f["latency_p95_ms"] == pytest.approx(95.0)
    assert w.figures(now=11.0)["requests_per_second"] == pytest.approx(9.0), "second 0 left"


async def test_steady_requests_publish_once_then_leave_it_to_the_interval() -> None:
    router = ServingRouter(cast(Any, None), GatewaySettings())
    now = [1000.0]
    router.clock = lambda: now[0]
    published: list[float] = []

    async def publish(t: Target) -> None:
        published.append(now[0])
        t.announced = t.last_activity

    router.publish = publish  # type: ignore[method-assign]
    t = Target("grp-x", "acme", ServingSpec(port=80), 1, [], RequestWindow(), last_activity=900.0)
    t.replicas["r1"] = Replica("r1", "127.0.0.1:1", ready=True)
    for _ in range(500):  # 5 s of requests 10 ms apart
        await router.acquire(t, set())
        await asyncio.sleep(0)
        now[0] += 0.01
    assert published == [1000.0], "only the request that ended the quiet spell publishes"
    now[0] += 2.0  # a quiet spell again
    await router.acquire(t, set())
    await asyncio.sleep(0)
    assert len(published) == 2
    await router.close()
