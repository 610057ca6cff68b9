"""`heteroflow run --plan`, `groups create [--plan]`, `jobs submit --plan`: the body goes to the
route's `/plan`, nothing is created, and the answer is shown node by node."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from heteroflow.cli import build_parser
from heteroflow.cli_user import commands, jobs, plan
from heteroflow.cli_user.client import Client, Context, Target

ANSWER: dict[str, Any] = {
    "kind": "task",
    "valid": True,
    "written": False,
    "fits": False,
    "tasks": [
        {
            "name": "task",
            "outcome": "pending",
            "stage": "whole_cards",
            "reason": "insufficient_gpus",
            "message": "needs 2 cards",
            "preempts": [],
            "admission": {
                "queue": "",
                "queue_limits": {},
                "queue_used": {},
                "tenant_quota": 0.0,
                "tenant_used": 0.0,
                "admitted": True,
                "reason": None,
                "message": "",
            },
            "nodes": [
                {"node_id": "node-b", "fits": True, "gpu_ids": ["b0", "b1"], "scores": {}},
                {
                    "node_id": "node-a",
                    "fits": False,
                    "stage": "whole_cards",
                    "reason": "insufficient_gpus",
                    "message": "1 free of 2",
                },
            ],
            "nodes_more": 3,
            "nodes_fit": 1,
            "pending": {
                "stage": "whole_cards",
                "reason": "insufficient_gpus",
                "detail": "",
                "queue": "",
                "position": 2,
                "eta": "unknown",
                "method": "nothing bounds it",
            },
        }
    ],
}


def served(seen: list[httpx.Request], output: str) -> Context:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/plan"):
            return httpx.Response(200, json=ANSWER)
        return httpx.Response(201, json={"id": "grp-1", "status": "pending"})

    http = httpx.Client(base_url="http://hf/api/v1", transport=httpx.MockTransport(answer))
    client = Client(Target("http://hf", "token", Path("/nowhere")), _http=http)
    return Context(client, output=output, out=io.StringIO(), err=io.StringIO())


@pytest.mark.parametrize(
    ("argv", "handler", "path"),
    [
        (["run", "--plan", "--gpus", "2", "img:1"], commands.cmd_run, "/api/v1/tasks/plan"),
        (
            ["groups", "create", "--plan", "{doc}"],
            plan.cmd_groups_create,
            "/api/v1/task-groups/plan",
        ),
        (["jobs", "submit", "--plan", "{doc}"], jobs.cmd_jobs_submit, "/api/v1/jobs/plan"),
    ],
    ids=["run", "groups-create", "jobs-submit"],
)
def test_plan_posts_to_the_plan_route_only_and_shows_each_node(
    argv: list[str], handler: Any, path: str, tmp_path: Path
) -> None:
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps({"name": "x", "image": "img:1"}))
    seen: list[httpx.Request] = []
    ctx = served(seen, "table")
    args = build_parser().parse_args([a.format(doc=doc) for a in argv])
    assert handler(ctx, args) == 0
    assert [(r.method, r.url.path) for r in seen] == [("POST", path)]
    text = ctx.out.getvalue()  # type: ignore[attr-defined]
    assert "pending at whole_cards" in text and "node-a" in text and "1 free of 2" in text
    assert "position 2, eta unknown" in text and "3 more node(s)" in text


def test_groups_create_without_plan_creates_the_group(tmp_path: Path) -> None:
    doc = tmp_path / "g.json"
    doc.write_text(json.dumps({"name": "g", "image": "img:1", "task_count": 2}))
    seen: list[httpx.Request] = []
    ctx = served(seen, "table")
    args = build_parser().parse_args(["groups", "create", str(doc)])
    assert plan.cmd_groups_create(ctx, args) == 0
    assert [(r.method, r.url.path) for r in seen] == [("POST", "/api/v1/task-groups")]
    assert json.loads(seen[0].content) == {"name": "g", "image": "img:1", "task_count": 2}
    assert ctx.out.getvalue().strip() == "grp-1"  # type: ignore[attr-defined]
