"""The pure parts of serving: the declaration, the task_type heuristic, replica choice, figures."""

from __future__ import annotations

import pytest

from libs.domain.errors import DomainError
from libs.domain.serving import Replica, RequestWindow, pick
from libs.domain.task import parse_create


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


async def test_other_gateways_requests_count_as_activity() -> None:
    from datetime import UTC, datetime
    from typing import Any, cast

    from libs.config import GatewaySettings
    from libs.domain.serving import ServingMetrics, ServingSpec
    from services.api_gateway.serving import ServingRouter, Target

    router = ServingRouter(cast(Any, None), GatewaySettings())
    now = [1000.0]
    router.clock = lambda: now[0]
    t = Target("grp-x", "acme", ServingSpec(port=80), 1, [], RequestWindow(), last_activity=0.0)
    router.targets[t.id] = t

    def figures(gateway: str, idle_s: float | None, concurrent: int = 0) -> ServingMetrics:
        return ServingMetrics(
            target_id="grp-x", tenant_id="acme", gateway=gateway, requests_per_second=0,
            concurrent_requests=concurrent, latency_p95_ms=0, queued_requests=0, replicas=1,
            ready_replicas=1, idle_s=idle_s, at=datetime.now(UTC),
        )  # fmt: skip

    await router.on_metrics(figures(router.gateway, 1.0))
    assert t.last_activity == 0.0, "its own figures are not news"
    await router.on_metrics(figures("other:1", 10.0))
    assert t.last_activity == 990.0
    await router.on_metrics(figures("other:1", 500.0))
    assert t.last_activity == 990.0, "older news never moves it back"
    await router.on_metrics(figures("other:1", None, concurrent=2))
    assert t.last_activity == 1000.0
    await router.close()
