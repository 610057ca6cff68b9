"""Scale decisions: who may scale, which ranks are added or stopped (revived for a scale
from zero), and how scaling events fold into the group; no servers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from libs.domain.errors import DomainError
from libs.domain.group.autoscale import Decision, Metric, Why
from libs.domain.group.decide import GroupPolicy, decide_group
from libs.domain.group.evolve import evolve_group
from libs.domain.group.model import Group, GroupStatus, parse_group, sized_members
from libs.domain.group.policy import GroupScalingUpdated, decided
from libs.domain.group.scaling import check_scalable, decide_scale, parse_replicas
from libs.domain.task.model import Task, TaskId, TenantId
from libs.domain.task.states import TaskStatus

S = TaskStatus
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def group(replicas: int | None = None, **kw: Any) -> Group:
    spec = parse_group({"name": "g", "image": "x", "task_count": 3} | kw, tenant=True)
    return Group(
        id="g",
        tenant_id=TenantId("a"),
        spec=spec,
        replicas=replicas,
        created_at=T0,
        updated_at=T0,
    )


def member(rank: int, status: TaskStatus, age: int = 0) -> Task:
    g = group()
    return Task(
        id=TaskId(f"t{rank}-{age}"),
        tenant_id=TenantId("a"),
        spec=g.spec.member_spec(rank),
        status=status,
        group_id="g",
        rank=rank,
        node_id="n",
        created_at=T0 + timedelta(seconds=age),
        updated_at=T0,
        started_at=T0,
    )


RUNNING3 = [member(0, S.RUNNING), member(1, S.RUNNING), member(2, S.RUNNING)]

CASES = [
    # id, current size, members, wanted, new ranks, stopped task ids
    ("up", None, RUNNING3, 5, [3, 4], []),
    ("down keeps the low ranks", None, RUNNING3, 1, [], ["t1-0", "t2-0"]),
    ("to zero", None, RUNNING3, 0, [], ["t0-0", "t1-0", "t2-0"]),
    ("same size", None, RUNNING3, 3, [], []),
    (
        "up over ended remnants",
        1,
        [member(0, S.RUNNING), member(1, S.STOPPED), member(2, S.CANCELLED)],
        3,
        [1, 2],
        [],
    ),
    (
        "up while a removed rank still stops",
        1,
        [member(0, S.RUNNING), member(1, S.STOPPING)],
        2,
        [1],
        [],
    ),
    (
        "down skips members already leaving",
        None,
        [member(0, S.RUNNING), member(1, S.STOPPING), member(2, S.RUNNING)],
        1,
        [],
        ["t2-0"],
    ),
]


@pytest.mark.parametrize(
    ("size", "members", "wanted", "new", "stopped"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_decide_scale(
    size: int | None, members: list[Task], wanted: int, new: list[int], stopped: list[str]
) -> None:
    g = group(size)
    plan = decide_scale(g, members, wanted)
    assert plan.new_ranks == new
    assert sorted(m.id for m in plan.stop) == stopped
    if wanted == g.size:
        assert plan.event is None
    else:
        assert plan.event is not None
        assert (plan.event.from_replicas, plan.event.to_replicas) == (g.size, wanted)
        after = evolve_group(g, plan.event, T0, 2)
        assert after.size == wanted


STATIC = [
    ("training", {"task_type": "training"}, "task_type=training"),
    ("tensor", {"parallelism": "tensor_parallel", "tensor_parallel_size": 2}, "tensor_parallel"),
    (
        "pipeline",
        {"parallelism": "pipeline_parallel", "pipeline_parallel_size": 2},
        "pipeline_parallel",
    ),
]


@pytest.mark.parametrize(("shape", "why"), [c[1:] for c in STATIC], ids=[c[0] for c in STATIC])
def test_static_world_refused(shape: dict[str, Any], why: str) -> None:
    with pytest.raises(DomainError) as err:
        check_scalable(group(**shape))
    assert err.value.code == 40003 and why in err.value.message


@pytest.mark.parametrize("shape", [{}, {"parallelism": "data_parallel"}], ids=["split", "dp"])
def test_replica_groups_scale(shape: dict[str, Any]) -> None:
    check_scalable(group(**shape))


@pytest.mark.parametrize("raw", [-1, 1025, "2", True, None, 1.5])
def test_parse_replicas_refuses(raw: object) -> None:
    with pytest.raises(DomainError):
        parse_replicas(raw)


def test_scaled_away_ranks_do_not_count_for_status() -> None:
    g = group(1).model_copy(update={"status": GroupStatus.RUNNING})
    members = [member(0, S.RUNNING), member(1, S.STOPPING), member(2, S.FAILED)]
    assert [m.rank for m in sized_members(g, members)] == [0]
    actions = decide_group(g, members, T0, GroupPolicy(), lambda _t: False)
    assert actions.empty  # rank 2's failure is not self-healed: that rank is gone


def test_group_scaled_to_zero_reads_stopped() -> None:
    g = group(0)
    members = [member(0, S.STOPPED), member(1, S.CANCELLED)]
    actions = decide_group(g, members, T0, GroupPolicy(), lambda _t: False)
    assert [e.to_status for e in actions.events] == [GroupStatus.STOPPED]  # type: ignore[attr-defined]


REVIVE = [
    # id, size, members, wanted, new ranks
    ("every replica stopped: back to the wanted ranks", 3, [member(0, S.STOPPED)], 2, [0, 1]),
    ("scaled to zero: from rank 0", 0, [member(0, S.CANCELLED)], 1, [0]),
    ("a live rank is kept", 2, [member(0, S.RUNNING), member(1, S.STOPPED)], 2, [1]),
]


@pytest.mark.parametrize(
    ("size", "members", "wanted", "new"), [c[1:] for c in REVIVE], ids=[c[0] for c in REVIVE]
)
def test_revive_brings_ended_ranks_back(
    size: int, members: list[Task], wanted: int, new: list[int]
) -> None:
    plain = decide_scale(group(size), members, wanted)
    plan = decide_scale(group(size), members, wanted, revive=True, source="autoscaler")
    assert plan.new_ranks == new and plan.stop == []
    assert plan.event is not None and plan.event.to_replicas == wanted
    assert plain.new_ranks == [r for r in new if r >= size]  # without revive: only above size


def test_scaling_events_fold_into_the_group() -> None:
    g = group(None)
    cfg = parse_group(
        {"name": "g", "image": "x", "task_count": 3, "auto_scale": AS}, tenant=True
    ).auto_scale
    upd = GroupScalingUpdated(group_id="g", fields=("auto_scale",), auto_scale=cfg)
    g = evolve_group(g, upd, T0, 2)
    assert g.spec.auto_scale == cfg and g.spec.schedule_window is None
    up = decide_scale(g, RUNNING3, 5, source="autoscaler").event
    assert up is not None
    g = evolve_group(g, up, T0 + timedelta(seconds=5), 3)
    assert (g.scaled_at, g.scaled_up_at) == (T0 + timedelta(seconds=5),) * 2
    down = decide_scale(g, RUNNING3, 4, source="autoscaler").event
    assert down is not None
    g = evolve_group(g, down, T0 + timedelta(seconds=9), 4)
    assert (g.scaled_at, g.scaled_up_at) == (T0 + timedelta(seconds=9), T0 + timedelta(seconds=5))
    d = Decision(Why.COOLDOWN_UP, 4, 6, 4)
    g = evolve_group(g, decided("g", Metric.QPS, 12.5, d), T0, 5)
    assert g.last_autoscale is not None and g.last_autoscale.same(d)
    removed = GroupScalingUpdated(group_id="g", fields=("auto_scale",))
    assert evolve_group(g, removed, T0, 6).spec.auto_scale is None


AS = {"metric": "qps", "target": 5, "max_replicas": 6}
