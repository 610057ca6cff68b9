"""The routers' figures as heard on the bus (libs/domain/router_figures.py): freshness per
gateway process, and when a draining replica counts as drained."""

from __future__ import annotations

from datetime import UTC, datetime

from libs.domain.router_figures import RouterFigures
from libs.domain.serving import ServingMetrics


def figures(
    gateway: str,
    *,
    target: str = "grp-1",
    outstanding: dict[str, int] | None = None,
    draining: tuple[str, ...] = (),
) -> ServingMetrics:
    return ServingMetrics(
        target_id=target,
        tenant_id="a",
        gateway=gateway,
        requests_per_second=1.0,
        concurrent_requests=0,
        latency_p95_ms=0.0,
        queued_requests=0,
        replicas=2,
        ready_replicas=2,
        at=datetime(2026, 1, 1, tzinfo=UTC),
        outstanding=outstanding or {},
        draining=list(draining),
    )


async def test_a_silent_gateway_is_forgotten() -> None:
    now = [100.0]
    book = RouterFigures(max_age_s=10, clock=lambda: now[0])
    await book.hear(figures("a"))
    now[0] = 105.0
    await book.hear(figures("b"))
    assert sorted(m.gateway for m in book.samples("grp-1")) == ["a", "b"]
    now[0] = 112.0
    assert [m.gateway for m in book.samples("grp-1")] == ["b"]
    assert book.samples("grp-other") == []


def test_drained_needs_every_fresh_gateway_to_know_it_and_count_nothing_on_it() -> None:
    now = [0.0]
    book = RouterFigures(max_age_s=30, clock=lambda: now[0])
    assert book.drained("grp-1", "t1")  # nothing routes to it
    book.record(figures("a", draining=("t1",)))
    book.record(figures("b"))  # b has not heard it is draining: may still send to it
    assert not book.drained("grp-1", "t1")
    book.record(figures("b", draining=("t1",), outstanding={"t1": 2}))
    assert not book.drained("grp-1", "t1")  # two requests still in flight on b
    book.record(figures("b", draining=("t1",), outstanding={"t2": 1}))
    assert book.drained("grp-1", "t1")
    assert not book.drained("grp-1", "t2")  # not draining at all
    book.record(figures("c", outstanding={"t1": 1}))
    assert not book.drained("grp-1", "t1")
    now[0] = 31.0  # c (and everyone) silent past the age: nobody routes to it any more
    assert book.drained("grp-1", "t1")
