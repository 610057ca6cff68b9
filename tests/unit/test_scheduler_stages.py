"""The feasibility stages and rankers as registered objects (placement/stages.py,
placement/rankers.py), the named scores a placement records, and the Planner's index."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from libs.domain.task.events import TaskStatusChanged
from libs.domain.task.model import Task, TaskId, TaskSpec, TenantId
from libs.domain.task.states import TaskStatus
from services.scheduler.controllers.placement import _place
from services.scheduler.placement.feasibility import NodeUsage, Quota, usage_of
from services.scheduler.placement.ledger import Ledger
from services.scheduler.placement.model import (
    Allocation,
    ClusterSnapshot,
    Gpu,
    Node,
    PendingTask,
    Requirement,
)
from services.scheduler.placement.planner import Planner, plan
from services.scheduler.placement.rankers import RANKERS, named_scores, rank, score
from services.scheduler.placement.search import search
from services.scheduler.placement.stages import (
    NODE_STAGE_ORDER,
    STAGES,
    STATIC_STAGES,
    check_node,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)
GB = 1024


def node(node_id: str = "n1", gpus: int = 4, **kw: Any) -> Node:
    model = kw.pop("model", "A100-80GB")
    vram = kw.pop("vram", 80 * GB)
    cards = tuple(Gpu(f"{node_id}-gpu{i}", i, "nvidia", model, vram) for i in range(gpus))
    fields: dict[str, Any] = {"memory_mb": 256 * GB, "cpu_cores": 64.0, **kw}
    online = fields.pop("online", True)
    return Node(node_id, online, gpus=cards, **fields)


def task(task_id: str = "t1", **req: Any) -> PendingTask:
    extra = {k: req.pop(k) for k in ("excluded_node_ids", "pools") if k in req}
    return PendingTask(task_id, "acme", Requirement(**req), created_at=NOW, **extra)


def held(node_id: str, cards: int, **kw: Any) -> Allocation:
    gpu_ids = tuple(f"{node_id}-gpu{i}" for i in range(cards))
    return Allocation(f"h-{node_id}", "acme", node_id, TaskStatus.RUNNING, gpu_ids, **kw)


# One rejection per stage: (stage name, task, node, what the node runs, quota).
REJECTIONS: list[tuple[str, PendingTask, Node, tuple[Allocation, ...], Quota | None]] = [
    ("pin", task(requested_node_id="n2"), node(), (), None),
    ("online", task(gpu_count=1), node(online=False), (), None),
    ("excluded", task(gpu_count=1, excluded_node_ids=frozenset({"n1"})), node(), (), None),
    ("pool", task(gpu_count=1, pools=frozenset({"a100"})), node(), (), None),
    ("runtime", task(runtime="process"), node(runtime="docker"), (), None),
    ("gpu_type", task(gpu_count=1, gpu_type="H100"), node(), (), None),
    ("vram", task(gpu_memory_mb=100 * GB, gpu_compute_ratio=0.5), node(), (), None),
    ("whole_cards", task(gpu_count=2), node(), (held("n1", 3),), None),
    ("fraction", task(gpu_memory_mb=8 * GB), node(gpus=1), (held("n1", 1),), None),
    ("memory", task(memory_mb=300 * GB), node(), (), None),
    ("cpu", task(cpu_cores=65.0), node(), (), None),
    (
        "anti_affinity",
        task(gpu_count=1, anti_affinity=("web",)),
        node(),
        (held("n1", 1, anti_affinity=("web",)),),
        None,
    ),
    (
        "starts_in_flight",
        task(gpu_count=1),
        node(max_starting=1),
        (replace(held("n1", 1), status=TaskStatus.STARTING),),
        None,
    ),
    ("tenant_quota", task(gpu_count=2), node(), (), Quota("acme", 1.0, 0.0)),
]


def test_the_registry_is_the_chain_in_order() -> None:
    names = [s.name for s in STAGES]
    assert len(set(names)) == len(names)
    assert tuple(s.reason for s in STAGES) == NODE_STAGE_ORDER
    assert len(set(NODE_STAGE_ORDER)) == len(NODE_STAGE_ORDER), "one reason names one stage"
    assert sorted(names) == sorted(r[0] for r in REJECTIONS), "every stage has a case below"
    assert [s.name for s in STATIC_STAGES] == ["online", "pool", "runtime", "gpu_type", "vram"]


@pytest.mark.parametrize(
    ("name", "pending", "on", "running", "quota"), REJECTIONS, ids=[r[0] for r in REJECTIONS]
)
def test_each_stage_rejects_with_its_own_reason(
    name: str,
    pending: PendingTask,
    on: Node,
    running: tuple[Allocation, ...],
    quota: Quota | None,
) -> None:
    """The chain stops at the first stage that rejects, and reports that stage's reason."""
    stage = next(s for s in STAGES if s.name == name)
    verdict, fit = check_node(pending, on, usage_of(running), quota=quota)
    assert fit is None
    assert verdict.reason is stage.reason
    if name != "tenant_quota":  # the quota stage needs the grant's cost, not a node
        assert not stage(pending, on, usage_of(running)).ok  # type: ignore[operator]


@pytest.mark.parametrize("stage", STATIC_STAGES, ids=lambda s: s.name)
def test_a_static_stage_answers_alike_for_nodes_of_one_class(stage: Any) -> None:
    """Static: the answer depends on the node's class and the request only, not on the
    node's id or on what it runs, so the index may cache it per class."""
    cases = [pending for name, pending, *_ in REJECTIONS if name == stage.name]
    cases += [task(gpu_count=1), task(runtime="process"), task(gpu_type="A100")]
    busy = usage_of((held("n1", 4, memory_mb=100 * GB),))
    pairs = [(node("n1"), node("n9")), (node("n1", online=False), node("n7", online=False))]
    for pending in cases:
        for a, b in pairs:
            here, there = stage.check(pending, a, NodeUsage()), stage.check(pending, b, busy)
            assert (here.ok, here.reason) == (there.ok, there.reason)


def test_rankers_name_their_scores_and_rank_in_registry_order() -> None:
    pending = task(gpu_count=1)
    nodes = [node("full", gpus=2), node("empty", gpus=8), node("half", gpus=4)]
    running = {"full": (held("full", 1),), "half": (held("half", 2),)}
    fits = [check_node(pending, n, usage_of(running.get(n.id, ())), quota=None)[1] for n in nodes]
    assert all(f is not None for f in fits)
    ranked = rank([f for f in fits if f is not None], pending)
    assert [f.node.id for f in ranked] == ["full", "half", "empty"]
    best = named_scores(ranked[0], pending)
    assert list(best) == [r.name for r in RANKERS]
    assert best["free_cards_after"] == 0 and best["card_room_after"] == 0.0
    assert tuple(best.values()) == score(ranked[0], pending)


def test_a_placement_records_the_chosen_nodes_named_scores() -> None:
    snap = ClusterSnapshot(
        now=NOW,
        nodes=(node("a", gpus=2), node("b", gpus=8)),
        allocations=(held("a", 1, memory_mb=8 * GB),),
    )
    (placed,) = plan(snap, [task(gpu_count=1, memory_mb=4 * GB)]).placements
    assert placed.node_id == "a", "bin-pack: the node left with fewest free cards"
    assert placed.scores == {
        "free_cards_after": 0,
        "card_room_after": 0.0,
        "free_memory_mb_after": 256 * GB - 8 * GB - 4 * GB,
    }
    # The scores say why: every other fit scores worse on the first ranker.
    fit_b = check_node(task(gpu_count=1), snap.nodes[1], NodeUsage(), quota=None)[1]
    assert fit_b is not None and named_scores(fit_b, task(gpu_count=1))["free_cards_after"] == 7


def test_the_placement_event_carries_the_scores() -> None:
    t = Task(
        id=TaskId("t1"),
        tenant_id=TenantId("acme"),
        status=TaskStatus.PENDING,
        spec=TaskSpec(name="t", image="busybox"),
        created_at=NOW,
        updated_at=NOW,
    )
    scores = {"free_cards_after": 0.0, "card_room_after": 0.0, "free_memory_mb_after": 1024.0}
    (event,) = _place("n1", ("n1-gpu0",), "", "nvidia/A100-80GB", None, scores)(t)
    assert isinstance(event, TaskStatusChanged) and event.scores == scores
    again = TaskStatusChanged.model_validate(event.model_dump(mode="json"))
    assert again.scores == scores
    (unscored,) = _place("n1", ("n1-gpu0",), "")(t)
    assert isinstance(unscored, TaskStatusChanged) and unscored.scores == {}
    legacy = event.model_dump(mode="json")
    del legacy["scores"]  # stored before the field existed
    assert TaskStatusChanged.model_validate(legacy).scores == {}


def test_a_planner_keeps_the_index_of_the_same_nodes_and_no_other() -> None:
    nodes = (node("a"), node("b"))
    first, second = Planner(), Planner()
    snap = ClusterSnapshot(now=NOW, nodes=nodes)
    index, _ = first.indexed(snap)
    assert first.indexed(replace(snap, now=NOW + timedelta(seconds=1)))[0] is index
    assert second.indexed(snap)[0] is not index, "each planner has its own"
    assert first.indexed(replace(snap, nodes=(node("a"), node("b"))))[0] is not index
    assert first.plan(snap, [task(gpu_count=1)]) == plan(snap, [task(gpu_count=1)])


def test_the_search_only_fits_what_the_chain_passes() -> None:
    """The walk's fits are exactly the nodes the whole chain accepts."""
    pending = task(gpu_count=2)
    nodes = (node("a", gpus=2), node("b", gpus=1), node("c", online=False), node("d"))
    snap = ClusterSnapshot(now=NOW, nodes=nodes)
    index, gpus = Planner().indexed(snap)
    found = search(index, Ledger(index, (), gpus), pending, None, None)
    chain = {n.id for n in nodes if check_node(pending, n, NodeUsage(), quota=None)[1]}
    assert {f.node.id for f in found.fits} == chain == {"a", "d"}
