"""AutoScaler decisions, table-driven: formula, clamps, cooldowns, scale from zero, quota,
suspended tenant, schedule window, scale-down choice and safety, the router metrics as
per-replica values; no servers."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from libs.domain.errors import DomainError
from libs.domain.group.autoscale import (
    AutoScale,
    Inputs,
    Metric,
    Replica,
    Why,
    choose_removals,
    computed_replicas,
    decide_autoscale,
    metric_value,
    overdue_drains,
    parse_auto_scale,
    safe_scale_down,
)
from libs.domain.group.serving import ServingMetrics

CFG = AutoScale(metric="qps", target=50, min_replicas=2, max_replicas=10)

FORMULA = [
    # id, current, metric, computed
    ("at target", 4, 50.0, 4),
    ("double load doubles", 2, 100.0, 4),
    ("rounds up", 3, 51.0, 4),
    ("exact product is not rounded up", 2, 50.0, 2),
    ("half load halves", 8, 25.0, 4),
    ("clamped to max", 4, 500.0, 10),
    ("clamped to min", 4, 1.0, 2),
    ("zero load goes to min", 6, 0.0, 2),
]


@pytest.mark.parametrize(
    ("current", "metric", "computed"), [c[1:] for c in FORMULA], ids=[c[0] for c in FORMULA]
)
def test_formula(current: int, metric: float, computed: int) -> None:
    assert computed_replicas(CFG, current, metric) == computed


DECISIONS = [
    # id, inputs, why, replicas
    ("scale up", {"current": 2, "metric": 150.0}, Why.SCALE_UP, 6),
    ("scale down", {"current": 6, "metric": 10.0}, Why.SCALE_DOWN, 2),
    ("at target", {"current": 3, "metric": 50.0}, Why.AT_TARGET, 3),
    ("no sample", {"current": 3, "metric": None}, Why.NO_METRIC, 3),
    (
        "up cooldown holds",
        {"current": 2, "metric": 150.0, "now": 100.0, "last_up_at": 50.0},
        Why.COOLDOWN_UP,
        2,
    ),
    (
        "up cooldown over",
        {"current": 2, "metric": 150.0, "now": 111.0, "last_up_at": 50.0},
        Why.SCALE_UP,
        6,
    ),
    (
        "down cooldown holds after any scale",
        {"current": 6, "metric": 10.0, "now": 299.0, "last_scale_at": 0.0},
        Why.COOLDOWN_DOWN,
        6,
    ),
    (
        "down cooldown over",
        {"current": 6, "metric": 10.0, "now": 300.0, "last_scale_at": 0.0},
        Why.SCALE_DOWN,
        2,
    ),
    (
        "down cooldown does not block up",
        {"current": 2, "metric": 150.0, "now": 10.0, "last_scale_at": 0.0},
        Why.SCALE_UP,
        6,
    ),
    ("scale from zero to min", {"current": 0, "metric": None}, Why.SCALE_FROM_ZERO, 2),
    (
        "a failed group is not revived",
        {"current": 0, "metric": None, "group_failed": True},
        Why.GROUP_FAILED,
        0,
    ),
    (
        "scale from zero waits out the up cooldown",
        {"current": 0, "metric": None, "now": 100.0, "last_up_at": 50.0},
        Why.COOLDOWN_UP,
        0,
    ),
    (
        "suspended: no scale up",
        {"current": 2, "metric": 150.0, "suspended": True},
        Why.TENANT_SUSPENDED,
        2,
    ),
    (
        "suspended: scale down still",
        {"current": 6, "metric": 10.0, "suspended": True},
        Why.SCALE_DOWN,
        2,
    ),
    (
        "suspended: no scale from zero",
        {"current": 0, "metric": None, "suspended": True},
        Why.TENANT_SUSPENDED,
        0,
    ),
    (
        "quota caps the growth",
        {"current": 2, "metric": 150.0, "gpu_per_replica": 1.0, "quota_left": 2.0},
        Why.QUOTA_CAPPED,
        4,
    ),
    (
        "quota fits all",
        {"current": 2, "metric": 150.0, "gpu_per_replica": 1.0, "quota_left": 8.0},
        Why.SCALE_UP,
        6,
    ),
    (
        "no quota left: none created",
        {"current": 2, "metric": 150.0, "gpu_per_replica": 2.0, "quota_left": 1.0},
        Why.QUOTA_EXHAUSTED,
        2,
    ),
    (
        "fractional replicas within quota",
        {"current": 2, "metric": 150.0, "gpu_per_replica": 0.5, "quota_left": 1.0},
        Why.QUOTA_CAPPED,
        4,
    ),
    (
        "rollout in progress: hands off",
        {"current": 2, "metric": 150.0, "rollout_active": True},
        Why.ROLLOUT,
        2,
    ),
    (
        "window in force: hands off",
        {"current": 2, "metric": 150.0, "window_in_force": True},
        Why.SCHEDULE_WINDOW,
        2,
    ),
]


@pytest.mark.parametrize(
    ("inputs", "why", "replicas"), [c[1:] for c in DECISIONS], ids=[c[0] for c in DECISIONS]
)
def test_decide(inputs: dict[str, Any], why: Why, replicas: int) -> None:
    d = decide_autoscale(CFG, Inputs(**({"now": 1000.0} | inputs)))
    assert (d.why, d.replicas) == (why, replicas)
    assert d.changes is (replicas != inputs["current"])


def r(rank: int, age: float = 600.0, conns: int = 0, draining: float | None = None) -> Replica:
    return Replica(f"t{rank}", rank, age, conns, draining)


REMOVALS = [
    # id, replicas, count, split, removed
    ("workers only, highest rank first", [r(0), r(1), r(2), r(3)], 2, False, ["t3", "t2"]),
    ("rank 0 kept even when asked for all", [r(0), r(1)], 2, False, ["t1"]),
    (
        "split: fewest connections first",
        [r(0, conns=1), r(1, conns=9), r(2, conns=4)],
        2,
        True,
        ["t0", "t2"],
    ),
    ("split: ties go to the highest rank", [r(0), r(1), r(2)], 1, True, ["t2"]),
    ("young replicas kept", [r(0), r(1), r(2, age=59.0), r(3, age=10.0)], 2, False, ["t1"]),
    ("split: young kept too", [r(0, age=5.0), r(1, conns=3)], 2, True, ["t1"]),
    ("draining ones are not chosen again", [r(0), r(1), r(2, draining=5.0)], 1, False, ["t1"]),
]


@pytest.mark.parametrize(
    ("replicas", "count", "split", "removed"),
    [c[1:] for c in REMOVALS],
    ids=[c[0] for c in REMOVALS],
)
def test_choose_removals(
    replicas: list[Replica], count: int, split: bool, removed: list[str]
) -> None:
    assert choose_removals(replicas, count, split=split) == removed


def test_overdue_drains() -> None:
    assert overdue_drains([r(0), r(1, draining=120.0), r(2, draining=121.0)]) == ["t2"]


REFUSED = [
    ("unknown metric", {"metric": "rps"}, 40003, "auto_scale.metric"),
    ("target 0", {"target": 0}, 40003, "auto_scale.target"),
    ("min above max", {"min_replicas": 5, "max_replicas": 2}, 40003, "auto_scale"),
    ("negative cooldown", {"cooldown_up_s": -1}, 40003, "auto_scale.cooldown_up_s"),
    ("unknown field", {"step": 2}, 40001, "auto_scale.step"),
    ("max missing", {"max_replicas": None}, 40003, "auto_scale.max_replicas"),
]


@pytest.mark.parametrize(
    ("fields", "code", "field"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_parse_refused(fields: dict[str, Any], code: int, field: str) -> None:
    raw = {"metric": "qps", "target": 50, "max_replicas": 4} | fields
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(DomainError) as err:
        parse_auto_scale(raw)
    assert err.value.code == code and field in (err.value.fields or []), err.value.message


def test_parse_defaults() -> None:
    cfg = parse_auto_scale({"metric": "gpu_utilization", "target": 70, "max_replicas": 8})
    assert (cfg.min_replicas, cfg.cooldown_up_s, cfg.cooldown_down_s) == (1, 60.0, 300.0)


SAFE_DOWN = [
    # id, live replicas, asked size, split, allowed size
    ("old replicas all go", [r(0), r(1), r(2), r(3)], 1, True, 1),
    ("a young top rank stops the scale-down", [r(0), r(1), r(2, age=10.0)], 1, True, 3),
    ("a young middle rank stops it there", [r(0), r(1, age=10.0), r(2), r(3)], 0, True, 2),
    ("split may go to zero", [r(0), r(1)], 0, True, 0),
    ("non-split keeps rank 0", [r(0), r(1)], 0, False, 1),
    ("a draining young replica may go", [r(0), r(1, age=1.0, draining=1.0)], 1, True, 1),
    ("dead ranks do not block", [r(0), r(3)], 1, True, 1),
]


@pytest.mark.parametrize(
    ("replicas", "target", "split", "size"),
    [c[1:] for c in SAFE_DOWN],
    ids=[c[0] for c in SAFE_DOWN],
)
def test_safe_scale_down(replicas: list[Replica], target: int, split: bool, size: int) -> None:
    assert safe_scale_down(replicas, target, split=split) == size


def figures(gateway: str, rps: float, conc: int, p95: float, queued: int) -> ServingMetrics:
    return ServingMetrics(
        target_id="grp-1",
        tenant_id="a",
        gateway=gateway,
        requests_per_second=rps,
        concurrent_requests=conc,
        latency_p95_ms=p95,
        queued_requests=queued,
        replicas=2,
        ready_replicas=2,
        at=datetime(2026, 1, 1, tzinfo=UTC),
    )


TWO_GATEWAYS = [figures("a", 30.0, 4, 80.0, 2), figures("b", 10.0, 2, 120.0, 0)]
VALUES = [
    # id, metric, samples, current, per-replica value
    ("qps adds gateways, per replica", Metric.QPS, TWO_GATEWAYS, 2, 20.0),
    ("concurrency per replica", Metric.CONCURRENCY, TWO_GATEWAYS, 3, 2.0),
    ("queue depth per replica", Metric.QUEUE_DEPTH, TWO_GATEWAYS, 1, 2.0),
    ("latency: the worst p95", Metric.LATENCY_P95_MS, TWO_GATEWAYS, 2, 120.0),
    ("no figures: no sample", Metric.QPS, [], 2, None),
    ("gpu utilization is not a router figure", Metric.GPU_UTILIZATION, TWO_GATEWAYS, 2, None),
    ("from zero replicas: the total", Metric.QPS, TWO_GATEWAYS, 0, 40.0),
]


@pytest.mark.parametrize(
    ("metric", "samples", "current", "value"),
    [c[1:] for c in VALUES],
    ids=[c[0] for c in VALUES],
)
def test_metric_value(
    metric: Metric, samples: list[ServingMetrics], current: int, value: float | None
) -> None:
    assert metric_value(metric, samples, current) == value


def test_qps_target_is_per_replica() -> None:
    """A qps target of 50 asks for one replica per 50 requests/s, whatever the current size."""
    cfg = AutoScale(metric="qps", target=50, max_replicas=100)
    for current in (1, 2, 7):
        value = metric_value(Metric.QPS, [figures("a", 420.0, 0, 0.0, 0)], current)
        assert value is not None
        assert computed_replicas(cfg, current, value) == 9
