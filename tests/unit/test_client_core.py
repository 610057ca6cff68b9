"""The Python client's pure logic over httpx.MockTransport: refusals as ApiError with code
and fields, retries only for idempotent calls on 429/503 with Retry-After, pages."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from heteroflow.client import ApiError, AsyncClient, Client
from heteroflow.client.core import MAX_RETRIES, retry_after
from libs.domain.task.model import TaskSpec


def _client(handler: Any, waits: list[float]) -> Client:
    return Client("http://gw", "tok", transport=httpx.MockTransport(handler), sleep=waits.append)


def test_refusal_carries_code_and_fields() -> None:
    def handler(_: httpx.Request) -> httpx.Response:
        body = {"error": "unknown field(s): gpus", "code": 40001, "fields": ["gpus"]}
        return httpx.Response(400, json=body)

    with pytest.raises(ApiError) as caught, _client(handler, []) as c:
        c.tasks.create({"gpus": 1})
    assert (caught.value.status, caught.value.code, caught.value.fields) == (400, 40001, ["gpus"])


def test_idempotent_call_waits_retry_after_then_succeeds() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["Authorization"])
        if len(seen) < 3:
            return httpx.Response(
                429, headers={"Retry-After": "2"}, json={"error": "x", "code": 42900}
            )
        return httpx.Response(200, json={"id": "t1"})

    waits: list[float] = []
    with _client(handler, waits) as c:
        assert c.tasks.get("t1") == {"id": "t1"}
    assert waits == [2.0, 2.0]
    assert seen == ["Bearer tok"] * 3


def test_post_is_not_retried() -> None:
    calls = 0

    def handler(_: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(503, headers={"Retry-After": "1"}, json={"error": "x", "code": 50300})

    waits: list[float] = []
    with pytest.raises(ApiError) as caught, _client(handler, waits) as c:
        c.tasks.create({"name": "a"})
    assert calls == 1 and waits == [] and caught.value.retry_after == 1.0


def test_no_retry_without_retry_after_and_gives_up_after_max() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        headers = {"Retry-After": "0"} if request.url.path.endswith("/t2") else {}
        return httpx.Response(503, headers=headers, json={"error": "x", "code": 50300})

    waits: list[float] = []
    with _client(handler, waits) as c:
        with pytest.raises(ApiError):
            c.tasks.get("t1")
        assert calls == 1
        with pytest.raises(ApiError):
            c.tasks.get("t2")
    assert calls == 1 + 1 + MAX_RETRIES and waits == [0.0] * MAX_RETRIES


def test_retry_after_reads_an_http_date() -> None:
    r = httpx.Response(429, headers={"Retry-After": "Wed, 21 Oct 2015 07:28:10 GMT"})
    assert retry_after(r, now=1445412480.0) == 10.0
    assert retry_after(httpx.Response(429, headers={"Retry-After": "soon"})) is None


def test_iter_walks_every_page_and_keeps_filters() -> None:
    asked: list[dict[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        q = dict(request.url.params)
        asked.append(q)
        page, per = int(q["page"]), int(q["per_page"])
        ids = [f"t{i}" for i in range(5)][(page - 1) * per : page * per]
        body = {"tasks": [{"id": i} for i in ids], "total": 5, "page": page, "per_page": per}
        return httpx.Response(200, json=body)

    with _client(handler, []) as c:
        got = [t["id"] for t in c.tasks.iter(per_page=2, labels={"team": "a"}, status=None)]
    assert got == ["t0", "t1", "t2", "t3", "t4"]
    assert [a["page"] for a in asked] == ["1", "2", "3"]
    assert all(a["labels"] == "team=a" and "status" not in a for a in asked)


def test_model_body_sends_only_set_fields() -> None:
    sent: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(201, json={"id": "t1"})

    spec = TaskSpec.model_validate({"name": "train", "command": "python t.py"})
    with _client(handler, []) as c:
        c.tasks.create(spec, tenant_id="acme")
    assert sent == [{"name": "train", "command": "python t.py"}]


async def test_async_client_retries_and_pages() -> None:
    calls = 0

    def handler(_: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            return httpx.Response(503, headers={"Retry-After": "1"}, json={"error": "x", "code": 1})
        return httpx.Response(200, json={"queues": [{"name": "q"}]})

    waits: list[float] = []

    async def sleep(s: float) -> None:
        waits.append(s)

    async with AsyncClient(
        "http://gw", "tok", transport=httpx.MockTransport(handler), sleep=sleep
    ) as c:
        assert [q["name"] async for q in c.queues.iter()] == ["q"]
    assert waits == [1.0] and calls == 2


SSE = b'data: one\n\n: keep-alive\n\ndata: two\n\nevent: end\ndata: {"status": "completed"}\n\n'


def _logs_api(stream: bytes, seen: list[httpx.Request]) -> Any:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=stream, headers={"content-type": "text/event-stream"})

    return handler


def test_follow_logs_yields_each_line_until_the_end_event() -> None:
    seen: list[httpx.Request] = []
    with _client(_logs_api(SSE, seen), []) as c:
        assert list(c.tasks.follow_logs("t 1", lines=5)) == ["one", "two"]
    assert seen[0].url.raw_path.split(b"?")[0] == b"/api/v1/tasks/t%201/logs"
    assert dict(seen[0].url.params) == {"follow": "true", "lines": "5"}


def test_follow_logs_raises_the_streams_error_event() -> None:
    stream = b'data: one\n\nevent: error\ndata: {"error": "node lost"}\n\n'
    with _client(_logs_api(stream, []), []) as c:
        lines = c.tasks.follow_logs("t1")
        assert next(lines) == "one"
        with pytest.raises(ApiError, match="node lost"):
            next(lines)


async def test_async_follow_logs_and_group_routes() -> None:
    seen: list[httpx.Request] = []
    logs = _logs_api(SSE, seen)

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/logs"):
            return logs(request)  # type: ignore[no-any-return]
        seen.append(request)
        return httpx.Response(200, json={"id": "grp-1"})

    async with AsyncClient("http://gw", "tok", transport=httpx.MockTransport(handler)) as c:
        assert [line async for line in c.tasks.follow_logs("t1")] == ["one", "two"]
        await c.groups.scale("grp-1", 3)
        await c.groups.autoscale("grp-1", None)
        await c.groups.pause_rollout("grp-1")
    calls = [(r.method, r.url.path, r.content) for r in seen[1:]]
    assert calls == [
        ("POST", "/api/v1/task-groups/grp-1/scale", b'{"replicas":3}'),
        ("PUT", "/api/v1/task-groups/grp-1", b'{"auto_scale":null}'),
        ("POST", "/api/v1/task-groups/grp-1/rollout/pause", b""),
    ]


def test_a_stream_refused_with_retry_after_is_retried() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            return httpx.Response(503, headers={"Retry-After": "1"}, json={"error": "busy"})
        return httpx.Response(200, content=SSE)

    waits: list[float] = []
    with _client(handler, waits) as c:
        assert list(c.tasks.follow_logs("t1")) == ["one", "two"]
    assert waits == [1.0]


def test_serve_goes_to_the_router_outside_the_api_prefix() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(502, json={"error": "no replica"})

    with _client(handler, []) as c:
        answer = c.serve("grp-1", "/v1/completions", json={"prompt": "hi"})
    assert answer.status_code == 502  # answered as the replica (or router) answers
    assert seen[0].url.path == "/serve/grp-1/v1/completions"


def test_operator_routes_paths_and_bodies() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={})

    with _client(handler, []) as c:
        c.nodes.get("n1", as_of="2026-01-01T00:00:00Z")
        c.nodes.uncordon_card("n1", "GPU-0")
        c.nodes.quarantine_card("n1", "GPU-0", reason="xid 79")
        c.nodes.join_token(ttl_s=60)
        c.tenants.create_token("acme", "ci", ttl_seconds=600)
        c.groups.plan({"name": "g"})
    assert [(r.method, str(r.url).removeprefix("http://gw/api/v1"), r.content) for r in seen] == [
        ("GET", "/nodes/n1?as_of=2026-01-01T00%3A00%3A00Z", b""),
        ("POST", "/nodes/n1/gpus/GPU-0/uncordon", b""),
        ("POST", "/nodes/n1/gpus/GPU-0/quarantine", b'{"reason":"xid 79"}'),
        ("POST", "/nodes/join-tokens?ttl_s=60", b""),
        ("POST", "/tenants/acme/tokens", b'{"subject":"ci","ttl_seconds":600}'),
        ("POST", "/task-groups/plan", b'{"name":"g"}'),
    ]
