"""Host ports the scheduler allocates: static-world groups' master ports, serving ports
without port mapping, pinned ports that are taken, release on end, loopback-only nodes."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from agent.inventory import Inventory
from agent.launch import run_spec
from libs.domain.group.model import GroupShape, GroupSpec, group_env
from libs.domain.group.serving import ServingSpec
from libs.domain.protocol import CommandKind, NodeCommand, TaskRunSpec
from libs.domain.reasons import ReasonCode
from libs.domain.task.events import TaskStatusChanged
from libs.domain.task.evolve import evolve_task
from libs.domain.task.model import Task, TaskId, TaskSpec, TaskType, TenantId
from libs.domain.task.states import TaskStatus
from services.scheduler.placement.model import (
    Allocation,
    ClusterSnapshot,
    Node,
    PendingTask,
    Requirement,
)
from services.scheduler.placement.planner import plan

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
S = TaskStatus
GB = 1024


def node(node_id: str, host: str = "m", address: str = "10.0.0.1", **kw: Any) -> Node:
    return replace(Node(node_id, True, 64 * GB, 32), host_id=host, address=address, **kw)


def member(task_id: str, gang: str, rank: int, *, pinned: int | None = None) -> PendingTask:
    # Rank 0 asks for the master port (0: any), every member is host-networked, and the
    # members of one gang spread over nodes as a training group's do.
    return PendingTask(
        task_id,
        "acme",
        Requirement(anti_affinity=(f"spread:{gang}",)),
        created_at=NOW,
        gang_id=gang,
        gang_size=2,
        master_port=(pinned or 0) if rank == 0 else None,
        host_network=True,
    )


def replica(task_id: str) -> PendingTask:
    return PendingTask(task_id, "acme", Requirement(), created_at=NOW, serves=True)


def snap(*nodes: Node, allocs: tuple[Allocation, ...] = ()) -> ClusterSnapshot:
    return ClusterSnapshot(NOW, nodes, allocs)


def held(task_id: str, node_id: str, *ports: int, status: TaskStatus = S.RUNNING) -> Allocation:
    return Allocation(task_id, "acme", node_id, status, ports=ports)


def test_two_groups_on_the_same_nodes_get_different_master_ports() -> None:
    # Two agents on one machine: both groups' rank 0 bind on the same host.
    cluster = snap(node("a"), node("b"))
    result = plan(cluster, [member("g1-0", "g1", 0), member("g1-1", "g1", 1)])
    first = result.placement_for("g1-0")
    assert first is not None and set(first.ports) == {"master"}
    assert 20000 <= first.ports["master"] <= 32000
    assert not result.placement_for("g1-1").ports  # type: ignore[union-attr]
    # The next round sees the first group holding its port.
    later = replace(cluster, allocations=(held("g1-0", first.node_id, first.ports["master"]),))
    second = plan(later, [member("g2-0", "g2", 0), member("g2-1", "g2", 1)])
    other = second.placement_for("g2-0")
    assert other is not None
    assert other.ports["master"] != first.ports["master"]


def test_two_groups_in_one_round_get_different_master_ports() -> None:
    result = plan(
        snap(node("a"), node("b")),
        [member(f"{g}-{r}", g, r) for g in ("g1", "g2") for r in (0, 1)],
    )
    ports = [result.placement_for(f"{g}-0").ports["master"] for g in ("g1", "g2")]  # type: ignore[union-attr]
    assert len(set(ports)) == 2


def test_a_pinned_master_port_that_is_taken_waits_with_a_named_reason() -> None:
    busy = (held("other", "a", 29500), held("other2", "b", 29500))
    result = plan(
        snap(node("a", host="h1"), node("b", host="h2"), allocs=busy),
        [member("g-0", "g", 0, pinned=29500), member("g-1", "g", 1)],
    )
    assert result.placement_for("g-0") is None and result.placement_for("g-1") is None
    why = result.unplaced_for("g-0")
    assert why is not None and why.reason is ReasonCode.PORT_TAKEN
    assert "master_port 29500" in why.message
    assert result.unplaced_for("g-1").reason is ReasonCode.GANG_INCOMPLETE  # type: ignore[union-attr]


def test_a_pinned_port_held_on_one_host_goes_to_another_node() -> None:
    result = plan(
        snap(
            node("a", host="h1"),
            node("b", host="h2"),
            node("c", host="h3"),
            allocs=(held("other", "a", 29500),),
        ),
        [member("g-0", "g", 0, pinned=29500), member("g-1", "g", 1)],
    )
    rank0 = result.placement_for("g-0")
    assert rank0 is not None and rank0.node_id != "a" and rank0.ports == {"master": 29500}


def test_ports_are_freed_when_the_task_ends() -> None:
    ended = (held("old", "a", 29500, status=S.COMPLETED), held("old1", "b", status=S.FAILED))
    result = plan(
        snap(node("a"), node("b"), allocs=ended),
        [member("g-0", "g", 0, pinned=29500), member("g-1", "g", 1)],
    )
    assert result.placement_for("g-0").ports == {"master": 29500}  # type: ignore[union-attr]


def test_a_used_up_range_waits_with_the_reason() -> None:
    tight = node("a", runtime="process", port_range=(20000, 20001))
    busy = (held("x", "a", 20000), held("y", "a", 20001))
    result = plan(snap(tight, allocs=busy), [replica("r")])
    assert result.placement_for("r") is None
    assert result.unplaced_for("r").reason is ReasonCode.PORT_TAKEN  # type: ignore[union-attr]
    free = plan(snap(tight, allocs=busy[:1]), [replica("r")])
    assert free.placement_for("r").ports == {"serve": 20001}  # type: ignore[union-attr]


def test_a_port_held_by_another_node_of_the_same_host_is_not_handed_out() -> None:
    # Two agents on one machine share its ports: a task on `a` holds 20000, so a replica
    # placed on `b` (the only node with room for it) gets the other port of the range.
    ports = (20000, 20001)
    small = node("a", runtime="process", port_range=ports, memory_mb=1 * GB)
    big = node("b", runtime="process", port_range=ports)
    wide = replace(replica("r"), requirement=Requirement(memory_mb=4 * GB))
    result = plan(snap(small, big, allocs=(held("x", "a", 20000),)), [wide])
    placed = result.placement_for("r")
    assert placed is not None and placed.node_id == "b" and placed.ports == {"serve": 20001}


def test_a_port_handed_out_in_a_round_is_held_for_the_rest_of_it() -> None:
    one = node("p", runtime="process", port_range=(20000, 20000))
    result = plan(snap(one), [replica("r1"), replica("r2")])
    placed = [result.placement_for(r) for r in ("r1", "r2")]
    assert [p.ports for p in placed if p is not None] == [{"serve": 20000}]
    waiting = result.unplaced_for("r1") or result.unplaced_for("r2")
    assert waiting is not None and waiting.reason is ReasonCode.PORT_TAKEN


def test_serving_replicas_on_a_process_node_get_a_port_each() -> None:
    result = plan(snap(node("p", runtime="process")), [replica("r1"), replica("r2")])
    ports = [result.placement_for(r).ports["serve"] for r in ("r1", "r2")]  # type: ignore[union-attr]
    assert len(set(ports)) == 2
    # Docker maps the declared port to a free host port of its own: nothing to allocate.
    docker = plan(snap(node("d", runtime="docker")), [replica("r1")])
    assert docker.placement_for("r1").ports == {}  # type: ignore[union-attr]


def test_loopback_nodes_on_one_host_still_hold_a_group() -> None:
    result = plan(
        snap(node("a", address="127.0.0.1"), node("b", address="127.0.0.1")),
        [member("g-0", "g", 0), member("g-1", "g", 1)],
    )
    assert {result.placement_for(t).node_id for t in ("g-0", "g-1")} == {"a", "b"}  # type: ignore[union-attr]


def test_a_group_across_hosts_avoids_a_loopback_only_node() -> None:
    # The loopback node is the one bin-packing prefers (the least free memory): the group
    # goes to the other two all the same.
    result = plan(
        snap(
            node("a", host="h1", address="127.0.0.1", memory_mb=32 * GB),
            node("b", host="h2", address="10.0.0.2"),
            node("c", host="h3", address="10.0.0.3"),
        ),
        [member("g-0", "g", 0), member("g-1", "g", 1)],
    )
    assert {result.placement_for(t).node_id for t in ("g-0", "g-1")} == {"b", "c"}  # type: ignore[union-attr]


def test_a_group_that_only_fits_with_a_loopback_node_across_hosts_waits() -> None:
    result = plan(
        snap(node("a", host="h1", address="127.0.0.1"), node("b", host="h2", address="10.0.0.2")),
        [member("g-0", "g", 0), member("g-1", "g", 1)],
    )
    why = result.unplaced_for("g-0")
    assert why is not None and why.reason is ReasonCode.LOOPBACK_ADDRESS
    assert "'a'" in why.message and "HETEROFLOW_ADDRESS" in why.message


def _task() -> Task:
    spec = TaskSpec(name="r", image="busybox", serving=ServingSpec(port=8080))
    return Task(
        id=TaskId("t1"), tenant_id=TenantId("acme"), spec=spec, created_at=NOW, updated_at=NOW
    )


def moved(task: Task, to: TaskStatus, actor: str, code: ReasonCode, **kw: Any) -> Task:
    event = TaskStatusChanged(
        task_id=task.id,
        from_status=task.status,
        to_status=to,
        actor=actor,
        reason_code=code,
        **kw,
    )
    return evolve_task(task, event, NOW, task.version + 1)


def test_ports_are_part_of_the_placement_event_and_leave_with_it() -> None:
    placed = moved(
        _task(), S.SCHEDULED, "scheduler", ReasonCode.PLACED, node_id="a", ports={"serve": 21000}
    )
    assert placed.ports == {"serve": 21000}
    assert Allocation.from_task(placed, {}).ports == (21000,)
    requeued = moved(placed, S.PENDING, "agent", ReasonCode.PREEMPTED, clear_placement=True)
    assert requeued.ports == {}


def test_master_port_is_the_allocated_one_else_the_pinned_one() -> None:
    template = TaskSpec(name="t", image="busybox", task_type=TaskType.TRAINING)
    spec = GroupSpec(template=template, shape=GroupShape(task_count=2))
    assert spec.shape.master_port is None
    assert group_env(spec, 1, "10.0.0.1", 2, "", 23456)["MASTER_PORT"] == "23456"
    pinned = spec.model_copy(update={"shape": GroupShape(task_count=2, master_port=29600)})
    assert group_env(pinned, 1, "10.0.0.1", 2, "")["MASTER_PORT"] == "29600"
    assert group_env(spec, 1, "10.0.0.1", 2, "")["MASTER_PORT"] == "29500"


def _start(spec: TaskSpec, **run: Any) -> NodeCommand:
    return NodeCommand(
        kind=CommandKind.START,
        node_id="n1",
        task_id="t1",
        attempt=0,
        status=S.SCHEDULED,
        run=TaskRunSpec(spec=spec, tenant_id="acme", **run),
    )


def test_the_agent_gives_the_task_its_allocated_port_and_network() -> None:
    inventory = Inventory(node_id="n1", hostname="h", memory_mb=4096, cpu_cores=2)
    serving = ServingSpec(port=8000, health_path="/healthz")
    spec = TaskSpec(name="r", image="busybox", serving=serving, env={"PORT": "9"})
    # Allocated (process runtime, host network): PORT and the served port are that one.
    run, _ = run_spec(_start(spec, serve_port=21234), inventory, "n1", "10.0.0.1", "process")
    assert (run.serve_port, run.env["PORT"], run.host_network) == (21234, "21234", False)
    # Mapped by docker: the declared port, and a PORT of the task's own is kept.
    run, _ = run_spec(_start(spec), inventory, "n1", "10.0.0.1", "docker")
    assert (run.serve_port, run.env["PORT"]) == (8000, "9")
    plain = spec.model_copy(update={"env": {}})
    assert run_spec(_start(plain), inventory, "n1", "h", "docker")[0].env["PORT"] == "8000"
    # A static-world member: the host's network.
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "23000"}
    member = spec.model_copy(update={"serving": None, "env": {}})
    run, _ = run_spec(
        _start(member, host_network=True, group_env=env), inventory, "n1", "h", "docker"
    )
    assert run.host_network and run.env["MASTER_PORT"] == "23000" and "PORT" not in run.env
