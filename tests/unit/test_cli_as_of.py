"""`heteroflow describe --as-of TIME` (and groups/jobs describe): the time goes to the server as
`as_of`, and the attempts and timeline entries shown stop at that time."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import httpx

from heteroflow.cli import build_parser
from heteroflow.cli_user import commands, events, jobs
from heteroflow.cli_user.client import Client, Context, Target

AS_OF = "2026-12-01T12:00:00Z"
TASK = {"id": "t1", "name": "t", "status": "running", "updated_at": "2026-12-01T11:00:00Z"}
TIMELINE = [
    {"occurred_at": "2026-12-01T10:00:00+00:00", "type": "created", "summary": "created"},
    {"occurred_at": "2026-12-01T13:00:00+00:00", "type": "failed", "summary": "after"},
]
RETRIES = [
    {"attempt": 1, "started_at": "2026-12-01T10:30:00+00:00", "status": "failed"},
    {"attempt": 2, "started_at": "2026-12-01T12:30:00+00:00", "status": "running"},
]


def served(seen: list[httpx.Request]) -> Context:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        path = request.url.path
        if path.endswith("/events"):
            return httpx.Response(200, json={"events": TIMELINE[::-1], "total": 2})
        if path.endswith("/retries"):
            return httpx.Response(200, json={"retries": RETRIES})
        return httpx.Response(200, json=TASK | {"tasks": []})

    http = httpx.Client(base_url="http://hf/api/v1", transport=httpx.MockTransport(answer))
    client = Client(Target("http://hf", "token", Path("/nowhere")), _http=http)
    return Context(client, output="json", out=io.StringIO(), err=io.StringIO())


def test_describe_as_of_asks_for_the_time_and_shows_history_up_to_it() -> None:
    seen: list[httpx.Request] = []
    ctx = served(seen)
    args = build_parser().parse_args(["describe", "t1", "--as-of", AS_OF])
    assert commands.cmd_describe(ctx, args) == 0
    task_reads = [r for r in seen if r.url.path == "/api/v1/tasks/t1"]
    assert [r.url.params.get("as_of") for r in task_reads] == [AS_OF]
    shown: dict[str, Any] = json.loads(ctx.out.getvalue())  # type: ignore[attr-defined]
    assert [e["summary"] for e in shown["events"]] == ["created"]
    assert [a["attempt"] for a in shown["retries"]] == [1]


def test_describe_without_as_of_is_the_live_read() -> None:
    seen: list[httpx.Request] = []
    ctx = served(seen)
    assert commands.cmd_describe(ctx, build_parser().parse_args(["describe", "t1"])) == 0
    assert all("as_of" not in r.url.params for r in seen)
    shown = json.loads(ctx.out.getvalue())  # type: ignore[attr-defined]
    assert len(shown["events"]) == 2 and len(shown["retries"]) == 2


def test_groups_and_jobs_describe_pass_as_of() -> None:
    for argv, handler in (
        (["groups", "describe", "g1", "--as-of", AS_OF], events.cmd_groups_describe),
        (["jobs", "describe", "j1", "--as-of", AS_OF], jobs.cmd_jobs_describe),
    ):
        seen: list[httpx.Request] = []
        assert handler(served(seen), build_parser().parse_args(argv)) == 0
        assert [r.url.params.get("as_of") for r in seen] == [AS_OF], argv
