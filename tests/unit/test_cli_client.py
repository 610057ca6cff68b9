"""The CLI's client is heteroflow.client underneath: its refusals become the commands' exit
codes, a missing route is named as such, no answer is `Unreachable` with a hint, and an
idempotent call answered 429/503 with Retry-After is retried as the Python client retries."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from heteroflow.cli_user.client import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_UNREACHABLE,
    ApiError,
    Client,
    Target,
    Unreachable,
)

TARGET = Target("http://hf", "tok", Path("/nonexistent"))


def _cli(handler: httpx.MockTransport) -> Client:
    return Client(TARGET, _http=httpx.Client(transport=handler, base_url="http://hf/api/v1"))


def test_a_missing_route_is_named_and_a_refusal_keeps_code_and_fields() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/plan"):
            return httpx.Response(405, json={"error": "Method Not Allowed", "code": 40501})
        body = {"error": "unknown field(s): gpuz", "code": 40001, "fields": ["gpuz"]}
        return httpx.Response(400, json=body)

    client = _cli(httpx.MockTransport(handler))
    with pytest.raises(ApiError) as missing:
        client.post("/tasks/plan", {})
    assert missing.value.exit_code == EXIT_NOT_FOUND
    assert "has no POST /api/v1/tasks/plan endpoint" in str(missing.value)
    with pytest.raises(ApiError) as refused:
        client.post("/tasks", {"gpuz": 1})
    assert (refused.value.exit_code, refused.value.code, refused.value.fields) == (
        EXIT_FAILED,
        40001,
        ["gpuz"],
    )


def test_no_answer_is_unreachable_with_a_hint() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(Unreachable) as caught:
        _cli(httpx.MockTransport(handler)).get("/tasks")
    assert caught.value.exit_code == EXIT_UNREACHABLE
    assert "http://hf: connection refused (is it running?" in str(caught.value)


def test_a_get_answered_429_with_retry_after_is_retried() -> None:
    answers = [
        httpx.Response(429, headers={"Retry-After": "0"}, json={"error": "slow down"}),
        httpx.Response(200, json={"tasks": []}),
    ]
    assert _cli(httpx.MockTransport(lambda _: answers.pop(0))).get("/tasks") == {"tasks": []}
    assert answers == []
