"""The routers' figures as heard on the bus (libs/domain/group/router_figures.py): freshness per
gateway process, when a draining replica counts as drained, and a target's activity for
idle sleep."""

from __future__ import annotations

from datetime import UTC, datetime

from libs.domain.group.router_figures import RouterFigures
from libs.domain.group.serving import ServingMetrics


def figures(
    gateway: str,
    *,
    target: str = "grp-1",
    outstanding: dict[str, int] | None = None,
    draining: tuple[str, ...] = (),
    idle_s: float | None = None,
    concurrent: int = 0,
    queued: int = 0,
) -> ServingMetrics:
    return ServingMetrics(
        target_id=target,
        tenant_id="a",
        gateway=gateway,
        requests_per_second=1.0,
        concurrent_requests=concurrent,
        latency_p95_ms=0.0,
        queued_requests=queued,
        replicas=2,
        ready_replicas=2,
        at=datetime(2026, 1, 1, tzinfo=UTC),
        outstanding=outstanding or {},
        draining=list(draining),
        idle_s=idle_s,
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


def test_activity_is_the_latest_any_router_reported_and_outlives_its_figures() -> None:
    now = [1000.0]
    book = RouterFigures(max_age_s=10, clock=lambda: now[0])
    assert book.activity_s("grp-1") is None  # no router reports it
    book.record(figures("a", idle_s=30.0))  # a's last request at 970
    book.record(figures("b", idle_s=5.0))  # b's at 995
    assert book.activity_s("grp-1") == 5.0
    book.record(figures("b", idle_s=500.0))  # older news never moves it back
    assert book.activity_s("grp-1") == 5.0
    now[0] = 1100.0  # both silent past max_age_s: the last request is still dated
    assert book.samples("grp-1") == []
    assert book.activity_s("grp-1") == 105.0
    book.record(figures("c"))  # figures without an idle measure date nothing
    assert book.activity_s("grp-1") == 105.0


def test_a_request_held_anywhere_is_activity_now_and_busy() -> None:
    now = [1000.0]
    book = RouterFigures(max_age_s=10, clock=lambda: now[0])
    book.record(figures("a", idle_s=300.0))
    assert not book.busy("grp-1")
    book.record(figures("b", idle_s=300.0, queued=1))
    assert book.busy("grp-1") and book.activity_s("grp-1") == 0.0
    now[0] = 1020.0  # b's figures expired: nothing is known to be held any more
    assert not book.busy("grp-1") and book.activity_s("grp-1") == 20.0
    book.record(figures("a", idle_s=0.0, concurrent=2))
    assert book.busy("grp-1") and not book.busy("grp-other")


def test_listening_counts_from_the_books_start() -> None:
    now = [50.0]
    book = RouterFigures(max_age_s=10, clock=lambda: now[0])
    now[0] = 58.5
    assert book.listening_s() == 8.5
