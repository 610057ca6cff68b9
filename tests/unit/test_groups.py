"""Group shapes, injected environment, status aggregation and fault tolerance: no servers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from libs.domain.errors import DomainError
from libs.domain.group.decide import GroupPolicy, decide_group
from libs.domain.group.events import GroupRecovery, GroupStatusChanged
from libs.domain.group.model import (
    Group,
    GroupSpec,
    GroupStatus,
    aggregate_status,
    current_members,
    group_env,
    parse_group,
)
from libs.domain.task.model import Task, TaskId, TenantId
from libs.domain.task.states import TaskStatus

S = TaskStatus
G = GroupStatus
T0 = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = GroupPolicy()


def spec(**kw: Any) -> GroupSpec:
    return parse_group({"name": "g", "image": "x", "task_count": 2} | kw, tenant=True)


def member(
    rank: int,
    status: TaskStatus,
    *,
    age: int = 0,
    node: str | None = "n",
    error: str = "",
    started: int | None = 0,
    finished: int | None = None,
) -> Task:
    return Task(
        id=TaskId(f"t{rank}-{age}"),
        tenant_id=TenantId("a"),
        spec=spec().member_spec(rank),
        status=status,
        group_id="g",
        rank=rank,
        node_id=node,
        error=error,
        created_at=T0 + timedelta(seconds=age),
        updated_at=T0,
        started_at=T0 + timedelta(seconds=started) if started is not None else None,
        finished_at=T0 + timedelta(seconds=finished) if finished is not None else None,
    )


def group(gspec: GroupSpec, status: GroupStatus = G.RUNNING, **kw: Any) -> Group:
    return Group(
        id="g",
        tenant_id=TenantId("a"),
        spec=gspec,
        status=status,
        created_at=T0,
        updated_at=T0,
        **kw,
    )


AGG = [
    ("all running", [S.RUNNING, S.RUNNING], False, G.RUNNING),
    ("one failed", [S.RUNNING, S.FAILED], False, G.FAILED),
    ("all sleeping", [S.SLEEPING, S.SLEEPING], False, G.SLEEPING),
    ("sleeping and failed (known gap closed)", [S.SLEEPING, S.FAILED], False, G.FAILED),
    ("all completed", [S.COMPLETED, S.COMPLETED], False, G.COMPLETED),
    ("completed and stopped", [S.COMPLETED, S.STOPPED], False, G.STOPPED),
    ("starting up", [S.PENDING, S.RUNNING], False, G.PENDING),
    ("replica starting up", [S.PENDING, S.RUNNING], True, G.RUNNING),
    ("stopping", [S.STOPPING, S.STOPPED], False, G.STOPPING),
    ("no members", [], False, G.PENDING),
    ("one done one running", [S.COMPLETED, S.RUNNING], False, G.RUNNING),
]


@pytest.mark.parametrize(
    ("statuses", "replicas", "expected"), [c[1:] for c in AGG], ids=[c[0] for c in AGG]
)
def test_aggregate_status(
    statuses: list[TaskStatus], replicas: bool, expected: GroupStatus
) -> None:
    members = [member(r, s) for r, s in enumerate(statuses)]
    assert aggregate_status(members, replicas=replicas) is expected


def test_remnants_are_ignored() -> None:
    old = member(0, S.FAILED, age=0)
    new = member(0, S.RUNNING, age=5)
    other = member(1, S.RUNNING)
    assert current_members([old, new, other]) == [new, other]
    assert aggregate_status(current_members([old, new, other])) is G.RUNNING


@pytest.mark.parametrize(
    ("raw", "field", "code"),
    [
        ({"task_count": 0}, "task_count", 40003),
        ({"parallelism": "ring"}, "parallelism", 40003),
        ({"parallelism": "tensor_parallel"}, "tensor_parallel_size", 40003),
        ({"group_id": "x"}, "group_id", 40002),
        ({"rank": 1}, "rank", 40002),
        ({"colour": "red"}, "colour", 40001),
        ({"task_count": "2"}, "task_count", 40003),
    ],
    ids=["zero count", "bad parallelism", "tp size", "group id", "rank", "unknown", "str count"],
)
def test_parse_group_refuses(raw: dict[str, Any], field: str, code: int) -> None:
    with pytest.raises(DomainError) as err:
        parse_group({"name": "g", "image": "x", "task_count": 2} | raw, tenant=True)
    assert err.value.code == code and field in err.value.message + " ".join(err.value.fields)


def test_training_env_multi_process_has_no_rank() -> None:
    s = spec(task_type="training", per_node_gpu=4)
    assert s.member_spec(1).gpu_required == 4 and s.static_world
    env = group_env(s, 1, "10.0.0.1", 2, "nvidia")
    assert env == {
        "WORLD_SIZE": "8",
        "NNODES": "2",
        "NODE_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "DIST_BACKEND": "nccl",
    }


def test_single_process_members_get_rank_and_tp_size() -> None:
    s = spec(parallelism="tensor_parallel", tensor_parallel_size=2)
    env = group_env(s, 1, "h0", 2, "huawei")
    assert env["RANK"] == "1" and env["LOCAL_RANK"] == "0" and env["WORLD_SIZE"] == "2"
    assert env["TENSOR_PARALLEL_SIZE"] == "2" and env["DIST_BACKEND"] == "hccl"
    assert "PIPELINE_PARALLEL_SIZE" not in env


def infra(t: Task) -> bool:
    return t.error.startswith("node ")


def test_static_member_failure_fails_group_and_stops_others() -> None:
    g = group(spec(task_type="training", per_node_gpu=1))
    tasks = [
        member(0, S.RUNNING),
        member(1, S.FAILED, error="exit code 3", finished=5),
        member(2, S.PENDING, node=None),
    ]
    plan = decide_group(g, tasks, T0 + timedelta(seconds=6), POLICY, infra)
    assert isinstance(plan.events[0], GroupStatusChanged)
    assert plan.events[0].to_status is G.FAILED
    assert plan.stop == ["t0-0"] and plan.fail == ["t2-0"] and not plan.new_ranks


def test_infra_failure_schedules_then_restarts_whole_world() -> None:
    s = spec(task_type="training", per_node_gpu=1)
    failed = [
        member(0, S.FAILED, error="node n lost", finished=30),
        member(1, S.STOPPED, finished=31),
    ]
    g = group(s, G.FAILED, failed_at=T0 + timedelta(seconds=31))
    plan = decide_group(g, failed, T0 + timedelta(seconds=32), POLICY, infra)
    (sched,) = plan.events
    assert isinstance(sched, GroupRecovery) and sched.kind == "restart_scheduled"
    assert sched.due_at == T0 + timedelta(seconds=91)
    g = g.model_copy(update={"restart_due_at": sched.due_at})
    assert decide_group(g, failed, T0 + timedelta(seconds=60), POLICY, infra).empty
    plan = decide_group(g, failed, T0 + timedelta(seconds=92), POLICY, infra)
    assert [e.kind for e in plan.events if isinstance(e, GroupRecovery)] == ["group_restart"]
    assert plan.new_ranks == [0, 1]


@pytest.mark.parametrize(
    ("error", "restarts", "finished", "now", "why"),
    [
        ("exit code 3", 0, 30, 40, "user error vetoes"),
        ("node n lost", 2, 30, 40, "two restarts used"),
        ("node n lost", 0, 700, 710, "not within 10 minutes of start"),
        ("node n lost", 0, 30, 31 + 1900, "past 30 minutes since failure"),
    ],
    ids=["veto", "max restarts", "late failure", "too old"],
)
def test_no_restart(error: str, restarts: int, finished: int, now: int, why: str) -> None:
    s = spec(task_type="training", per_node_gpu=1)
    tasks = [
        member(0, S.FAILED, error=error, finished=finished),
        member(1, S.STOPPED, finished=finished),
    ]
    g = group(s, G.FAILED, restarts=restarts, failed_at=T0 + timedelta(seconds=finished))
    plan = decide_group(g, tasks, T0 + timedelta(seconds=now), POLICY, infra)
    assert not any(isinstance(e, GroupRecovery) for e in plan.events), why


def test_replica_self_heal_replaces_only_the_failed_rank() -> None:
    g = group(spec(parallelism="split"))
    tasks = [member(0, S.FAILED, error="exit code 137"), member(1, S.RUNNING)]
    plan = decide_group(g, tasks, T0, POLICY, infra)
    assert plan.new_ranks == [0] and not plan.stop
    assert not any(isinstance(e, GroupStatusChanged) for e in plan.events)


def test_inference_rebuild_until_five() -> None:
    s = spec(task_type="inference", task_count=1)
    tasks = [member(0, S.FAILED, error="exit code 1")]
    plan = decide_group(group(s, rebuilds=4), tasks, T0, POLICY, infra)
    assert plan.new_ranks == [0] and plan.priority == 100
    plan = decide_group(group(s, rebuilds=5), tasks, T0, POLICY, infra)
    assert not plan.new_ranks
    assert any(isinstance(e, GroupStatusChanged) and e.to_status is G.FAILED for e in plan.events)
    assert decide_group(group(s), tasks, T0, POLICY, infra, allow_rebuild=False).empty


def test_sleeping_group_whose_last_task_fails_is_not_stuck() -> None:
    s = spec(task_type="batch", task_count=1)
    plan = decide_group(group(s, G.SLEEPING), [member(0, S.FAILED, error="x")], T0, POLICY, infra)
    assert any(isinstance(e, GroupStatusChanged) and e.to_status is G.FAILED for e in plan.events)


def crash_history(failures: int, last_finished: int) -> list[Task]:
    """Rank 0 failed `failures` times (the newest at `last_finished` s); rank 1 runs."""
    rows = [
        member(0, S.FAILED, age=i, error="exit code 1", finished=last_finished - (failures - i))
        for i in range(1, failures)
    ]
    rows.append(member(0, S.FAILED, age=failures, error="exit code 1", finished=last_finished))
    return [*rows, member(1, S.RUNNING)]


@pytest.mark.parametrize(
    ("failures", "waited_s", "replaced"),
    [
        (1, 0, True),  # the first replacement is immediate
        (2, 9, False),  # then 10 s
        (2, 10, True),
        (3, 19, False),  # 20 s
        (3, 20, True),
        (5, 79, False),  # 80 s
        (5, 80, True),
    ],
    ids=lambda v: str(v),
)
def test_replica_self_heal_backs_off_exponentially(
    failures: int, waited_s: int, replaced: bool
) -> None:
    g = group(spec(parallelism="split"))
    plan = decide_group(
        g, crash_history(failures, 0), T0 + timedelta(seconds=waited_s), POLICY, infra
    )
    assert (plan.new_ranks == [0]) is replaced
    assert not any(isinstance(e, GroupStatusChanged) for e in plan.events), "stays as it is"


def test_crash_looping_replica_fails_the_group_with_a_reason() -> None:
    g = group(spec(parallelism="split"))
    tasks = crash_history(POLICY.replica_max_restarts + 1, 0)
    plan = decide_group(g, tasks, T0 + timedelta(seconds=300), POLICY, infra)
    assert not plan.new_ranks
    [change] = [e for e in plan.events if isinstance(e, GroupStatusChanged)]
    assert change.to_status is G.FAILED and change.reason_code.value == "crash_loop"
    assert "rank 0 failed 6 times" in change.reason
    assert plan.stop == ["t1-0"], "the healthy replica is stopped with the group"
    # Judged once: the next scan adds no second failure event.
    again = decide_group(group(g.spec, G.FAILED), tasks, T0 + timedelta(seconds=302), POLICY, infra)
    assert not again.events
    # Failures older than the crash window do not count.
    late = decide_group(g, tasks, T0 + timedelta(seconds=700), POLICY, infra)
    assert late.new_ranks == [0]


@pytest.mark.parametrize("parallelism", ["tensor_parallel", "pipeline_parallel"])
def test_tp_pp_inference_world_is_rebuilt_whole_until_five(parallelism: str) -> None:
    size = {f"{parallelism.split('_')[0]}_parallel_size": 2}
    s = spec(task_type="inference", parallelism=parallelism, **size)
    assert s.static_world and s.is_inference
    broken = [member(0, S.FAILED, error="exit code 1", finished=5), member(1, S.RUNNING)]
    plan = decide_group(group(s), broken, T0 + timedelta(seconds=6), POLICY, infra)
    # The world is broken: the other rank ends first, nothing is rebuilt yet.
    assert plan.stop == ["t1-0"] and not plan.new_ranks and not plan.events
    ending = [broken[0], member(1, S.STOPPING)]
    assert decide_group(group(s), ending, T0, POLICY, infra).empty
    ended = [broken[0], member(1, S.STOPPED, finished=7)]
    plan = decide_group(group(s, rebuilds=4), ended, T0, POLICY, infra)
    assert plan.new_ranks == [0, 1] and plan.priority == 100
    (rebuild,) = plan.events
    assert isinstance(rebuild, GroupRecovery) and rebuild.kind == "inference_rebuild"
    assert decide_group(group(s), ended, T0, POLICY, infra, allow_rebuild=False).empty
    plan = decide_group(group(s, rebuilds=5), ended, T0, POLICY, infra)
    assert not plan.new_ranks
    assert any(isinstance(e, GroupStatusChanged) and e.to_status is G.FAILED for e in plan.events)


def test_training_world_still_gets_the_restart_not_the_rebuild() -> None:
    s = spec(task_type="training", parallelism="tensor_parallel", tensor_parallel_size=2)
    ended = [member(0, S.FAILED, error="node n lost", finished=30), member(1, S.STOPPED)]
    g = group(s, G.FAILED, failed_at=T0 + timedelta(seconds=31))
    plan = decide_group(g, ended, T0 + timedelta(seconds=32), POLICY, infra)
    assert [e.kind for e in plan.events if isinstance(e, GroupRecovery)] == ["restart_scheduled"]
