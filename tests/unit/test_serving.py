"""The pure parts of serving: the declaration, the task_type heuristic, replica choice, figures."""

from __future__ import annotations

import asyncio

import pytest

from libs.domain.errors import DomainError
from libs.domain.group.serving import Replica, RequestWindow, pick
from libs.domain.task.model import parse_create


@pytest.mark.parametrize(
    ("body", "inference"),
    [
        ({"image": "vllm/vllm-openai:latest"}, True),
        ({"image": "lmsysorg/sglang:v0.4"}, True),
        ({"image": "ghcr.io/huggingface/text-generation-inference:2"}, True),
        ({"image": "nvcr.io/nvidia/tritonserver:24.01-py3"}, True),
        ({"image": "ghcr.io/ggerganov/llama.cpp:server"}, True),
        ({"image": "ascend/mindie:1.0"}, True),
        ({"image": "busybox:latest", "serving": {"port": 8000}}, True),
        ({"image": "busybox:latest"}, False),
        ({"image": "myapp:vllm-fix"}, False),  # the tag is not the engine
        ({"image": "pytorch/pytorch:2.3"}, False),
        # task_type is authoritative: only "" falls back to the heuristic.
        ({"image": "vllm/vllm-openai", "task_type": "batch"}, False),
        ({"image": "busybox", "task_type": "training", "serving": {"port": 80}}, False),
        ({"image": "busybox", "task_type": "inference"}, True),
    ],
    ids=lambda v: str(v),
)
def test_task_type_heuristic(body: dict[str, object], inference: bool) -> None:
    spec = parse_create({"name": "t"} | body, tenant=True)
    assert spec.is_inference is inference


@pytest.mark.parametrize(
    ("serving", "field"),
    [
        ({"port": 0}, "serving.port"),
        ({"port": 70000}, "serving.port"),
        ({"port": 80, "health_path": "health"}, "serving.health_path"),
        ({"port": 80, "metrics_path": "/a b"}, "serving.metrics_path"),
        ({"port": 80, "bogus": 1}, "serving.bogus"),
        ({}, "serving.port"),
    ],
    ids=lambda v: str(v),
)
def test_serving_declaration_refusals_name_the_field(serving: object, field: str) -> None:
    with pytest.raises(DomainError) as err:
        parse_create({"name": "t", "image": "x", "serving": serving}, tenant=True)
    assert field in err.value.fields


def test_pick_least_outstanding_then_least_recent() -> None:
    a, b, c = Replica("a", "h:1", ready=True), Replica("b", "h:2", ready=True), Replica("c", "h:3")
    a.outstanding, b.outstanding = 2, 1
    assert pick([a, b, c]) is b  # c is not ready
    b.outstanding = 2
    a.last_pick, b.last_pick = 5, 3
    assert pick([a, b, c]) is b
    assert pick([a, b, c], exclude={"b"}) is a
    assert pick([c]) is None


def test_request_window_figures() -> None:
    w = RequestWindow(window_s=10)
    for i in range(20):
        w.finished(now=float(i) / 2, latency_s=0.001 * (i + 1))
    f = w.figures(now=10.0)
    assert f["requests_per_second"] == pytest.approx(2.0)
    assert f["latency_p95_ms"] == pytest.approx(19.0)
    assert w.figures(now=100.0)["requests_per_second"] == 0


async def test_figures_date_the_last_request_or_the_watch_and_a_request_is_told_at_once() -> None:
    from typing import Any, cast

    from libs.config import GatewaySettings
    from libs.domain.group.serving import ServingSpec
    from services.api_gateway.serving import ServingRouter, Target

    router = ServingRouter(cast(Any, None), GatewaySettings())
    now = [1000.0]
    router.clock = lambda: now[0]
    published: list[float | None] = []

    async def publish(t: Target) -> None:
        published.append(router.metrics(t).idle_s)
        t.announced = t.last_activity

    router.publish = publish  # type: ignore[method-assign]
    t = Target("grp-x", "acme", ServingSpec(port=80), 1, [], RequestWindow(), last_activity=900.0)
    t.replicas["r1"] = Replica("r1", "127.0.0.1:1", ready=True)
    assert router.metrics(t).idle_s == 100.0, "watched since 900, no request yet"
    await router.acquire(t, set())
    await asyncio.sleep(0)
    assert published == [0.0], "the first request after a quiet spell is published at once"
    now[0] = 1000.5
    await router.acquire(t, set())
    await asyncio.sleep(0)
    assert published == [0.0], "within a second of the last told: left to the interval"
    now[0] = 1030.0
    assert router.metrics(t).idle_s == 29.5
    await router.acquire(t, set())
    await asyncio.sleep(0)
    assert published == [0.0, 0.0]
    await router.close()


async def test_a_request_waiting_for_a_replica_leaves_the_loop_to_others() -> None:
    """A change before the wait does not count (edge-triggered): a request whose pick still
    finds nothing waits again, and the process's other work runs meanwhile."""
    from typing import Any, cast

    from libs.config import GatewaySettings
    from libs.domain.group.serving import ServingSpec
    from services.api_gateway.serving import ServeUnavailable, ServingRouter, Target

    router = ServingRouter(cast(Any, None), GatewaySettings(serve_wait_s=0.3))
    t = Target("task-x", "acme", ServingSpec(port=80), 0, [], RequestWindow())
    t.replicas["r1"] = Replica("r1", "127.0.0.1:1", ready=True)
    t.changed()  # a refresh found r1 ready, before the request came
    ticks = 0

    async def other_work() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(other_work())
    with pytest.raises(ServeUnavailable, match="no ready replica within 0.3s"):
        await router.acquire(t, {"r1"})  # r1 tried already: nothing to pick
    ticker.cancel()
    assert ticks >= 5, f"the loop ran other work {ticks} times in the 0.3 s wait"

    # A replica read ready wakes a waiting request at once, not at its next poll (1 s).
    waiting = asyncio.create_task(router.acquire(t, {"r1"}))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    t.replicas["r2"] = Replica("r2", "127.0.0.1:2", ready=True)
    t.changed()
    async with asyncio.timeout(0.9):
        assert (await waiting).task_id == "r2"
    await router.close()
