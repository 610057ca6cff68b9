"""The user CLI without a server: rendering (tables, YAML, cells, views), argument parsing,
credential resolution, SSE parsing, and the run-wait loop over a scripted transport."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from heteroflow.cli import build_parser
from heteroflow.cli_user import commands, events
from heteroflow.cli_user import output as out
from heteroflow.cli_user.client import (
    EXIT_NOT_FOUND,
    EXIT_UNREACHABLE,
    Client,
    Context,
    SseEvent,
    Target,
    UsageError,
    api_error,
    parse_sse,
    resolve_target,
)

NOW = datetime(2025, 1, 2, 12, 0, 0, tzinfo=UTC)


# --- tables and cells ---------------------------------------------------------------------


def test_table_pads_each_column_to_its_widest_cell() -> None:
    text = out.table(("ID", "NAME", "GPUS"), [("task-1", "a", 2), ("t2", "longer-name", None)])
    assert text.splitlines() == [
        "ID       NAME          GPUS",
        "task-1   a             2",
        "t2       longer-name   -",
    ]


def test_table_without_rows_is_the_header_and_has_no_trailing_blanks() -> None:
    assert out.table(("A", "B"), []) == "A   B"
    lines = out.table(("A", "LAST"), [("x", "")]).splitlines()
    assert all(line == line.rstrip() for line in lines)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "-"),
        ("", "-"),
        ([], "-"),
        (True, "true"),
        (2.0, "2"),
        (0.5, "0.5"),
        (["a", "b"], "a,b"),
        ({"team": "ml", "env": "prod"}, "team=ml,env=prod"),
    ],
    ids=["none", "empty", "empty-list", "bool", "whole-float", "float", "list", "map"],
)
def test_cell(value: Any, text: str) -> None:
    assert out.cell(value) == text


def test_fields_align_values() -> None:
    assert out.fields([("ID", "t1"), ("Pending reason", "no GPU")]).splitlines() == [
        "ID:              t1",
        "Pending reason:  no GPU",
    ]


@pytest.mark.parametrize(
    ("delta", "text"),
    [
        (timedelta(seconds=5), "5s"),
        (timedelta(seconds=119), "119s"),
        (timedelta(minutes=5), "5m"),
        (timedelta(hours=3), "3h"),
        (timedelta(days=2, hours=5), "2d"),
        (timedelta(seconds=-3), "0s"),  # a clock a little ahead of ours
    ],
    ids=["seconds", "under-2m", "minutes", "hours", "days", "future"],
)
def test_age(delta: timedelta, text: str) -> None:
    assert out.age((NOW - delta).isoformat(), NOW) == text


def test_age_of_nothing_or_garbage() -> None:
    assert out.age(None, NOW) == "-" and out.age("yesterday", NOW) == "-"
    assert out.age("2025-01-02T11:59:00Z", NOW) == "60s"


@pytest.mark.parametrize(
    ("task", "text"),
    [
        ({"gpu_required": 2}, "2"),
        ({"gpu_required": 1, "gpu_type": "nvidia/A100"}, "1:nvidia/A100"),
        ({"gpu_required": 0, "gpu_memory_mb": 8192}, "8192MiB"),
        ({"gpu_required": 0, "gpu_compute_ratio": 0.25}, "0.25"),
        ({"gpu_required": 0}, "0"),
        ({"variants": [{"gpu_required": 1}, {"gpu_required": 0}], "variant": None}, "2 variants"),
        (
            {"variants": [{}, {"gpu_required": 1, "gpu_type": "huawei"}], "variant": 1},
            "1:huawei [variant 1]",
        ),
    ],
    ids=["cards", "typed", "vram-fraction", "ratio-fraction", "none", "variants", "placed"],
)
def test_task_gpus(task: dict[str, Any], text: str) -> None:
    assert out.task_gpus(task) == text


def test_node_gpus_group_cards_by_vendor_and_model() -> None:
    cards = [{"vendor": "nvidia", "model": "A100"}] * 4 + [{"vendor": "amd", "model": "MI300"}]
    assert out.node_gpus({"inventory": {"gpus": cards}}) == "nvidia:A100x4,amd:MI300x1"
    assert out.node_gpus({"inventory": {"gpus": []}}) == "0"


@pytest.mark.parametrize(
    ("mb", "text"), [(512, "512MiB"), (2048, "2GiB"), (24105, "23.5GiB"), (0, "-"), (None, "-")]
)
def test_mebibytes(mb: Any, text: str) -> None:
    assert out.mebibytes(mb) == text


# --- YAML -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("busybox", "busybox"),
        ("task-1f2e", "task-1f2e"),
        ("/data/in", "/data/in"),
        ("", '""'),
        ("true", '"true"'),
        ("No", '"No"'),
        ("null", '"null"'),
        ("1.5", '"1.5"'),
        ("10176", '"10176"'),
        ("127.0.0.1", '"127.0.0.1"'),
        ("a: b", '"a: b"'),
        ("echo $A; exit 3", '"echo $A; exit 3"'),
        ("-flag", '"-flag"'),
        ("two\nlines", '"two\\nlines"'),
        ("trailing ", '"trailing "'),
        (".inf", '".inf"'),
        (None, "null"),
        (False, "false"),
        (3, "3"),
        (1.0, "1.0"),
        (float("nan"), ".nan"),
        ({}, "{}"),
        ([], "[]"),
    ],
)
def test_yaml_scalar(value: Any, text: str) -> None:
    assert out.yaml_scalar(value) == text


def test_dump_yaml_nests_maps_and_sequences_in_block_style() -> None:
    value = {
        "id": "task-1",
        "labels": {"team": "ml"},
        "env": {},
        "gpu_ids": ["g0", "g1"],
        "volumes": [{"host_path": "/data", "read_only": True}],
        "matrix": [[1, 2], []],
        "exit_code": None,
    }
    assert out.dump_yaml(value) == (
        "id: task-1\n"
        "labels:\n"
        "  team: ml\n"
        "env: {}\n"
        "gpu_ids:\n"
        "  - g0\n"
        "  - g1\n"
        "volumes:\n"
        "  - host_path: /data\n"
        "    read_only: true\n"
        "matrix:\n"
        "  - - 1\n"
        "    - 2\n"
        "  - []\n"
        "exit_code: null\n"
    )


def test_dump_yaml_of_a_list_and_of_a_scalar() -> None:
    assert out.dump_yaml([{"a": 1}, {"a": 2}]) == "- a: 1\n- a: 2\n"
    assert out.dump_yaml("x") == "x\n" and out.dump_yaml([]) == "[]\n"


def test_to_yaml_falls_back_to_the_builtin_emitter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml → ImportError
    value = {"tasks": [{"id": "t1", "status": "running"}]}
    assert out.to_yaml(value) == out.dump_yaml(value)
    assert out.render(value, "yaml") == out.dump_yaml(value).rstrip("\n")
    assert json.loads(out.render(value, "json")) == value


# --- views ----------------------------------------------------------------------------------


def task(**fields: Any) -> dict[str, Any]:
    base = {
        "id": "task-1",
        "name": "train",
        "status": "running",
        "node_id": "n1",
        "gpu_required": 2,
        "priority": 10,
        "created_at": "2025-01-02T11:55:00Z",
        "image": "busybox",
        "command": "echo hi",
        "retry_count": 0,
        "max_retries": 3,
        "retry_strategy": "retry_new_node",
        "memory_mb": 2048,
    }
    return base | fields


def test_ps_table_columns() -> None:
    header, row = out.ps_table([task()]).splitlines()
    assert header.split() == ["ID", "NAME", "STATUS", "NODE", "GPUS", "PRIORITY", "AGE"]
    assert row.split()[:6] == ["task-1", "train", "running", "n1", "2", "10"]


def test_describe_shows_pending_reason_attempts_and_timeline() -> None:
    pending = task(status="pending", node_id=None, pending_reason="insufficient_gpus: 0 free")
    attempts = [{"attempt": 1, "status": "pending", "memory_mb": 2048}]
    events = [
        {
            "kind": "node_lost_migration",
            "message": "moved",
            "occurred_at": "2025-01-02T11:58:00+00:00",
            "details": {"from_node": "n1"},
            "subject_id": "task-1",
        }
    ]
    text = out.describe_text(pending, attempts, events)
    assert "Pending reason:  insufficient_gpus: 0 free" in text
    assert "Retries:         0 of 3 (retry_new_node)" in text
    assert "  ATTEMPT   NODE   STATUS" in text
    assert "node_lost_migration   moved from_node=n1" in text
    assert "Pending reason" not in out.describe_text(task(), [], [])
    assert "(this server has no timeline endpoint)" in out.describe_text(task(), [], None)


def test_describe_shows_a_loan_from_both_sides() -> None:
    lender = out.describe_text(task(status="sleeping", lent_to="task-2", wake_queued=True), [], [])
    assert "Card lent to:" in lender and "task-2 (wake queued until it ends)" in lender
    borrower = out.describe_text(task(borrowed_from="task-1"), [], [])
    assert "Card borrowed from:" in borrower and "task-1" in borrower
    plain = out.describe_text(task(lent_to="", borrowed_from=""), [], [])
    assert "Card" not in plain


# --- parsing ------------------------------------------------------------------------------


def parse(*argv: str) -> Any:
    return build_parser().parse_args(list(argv))


def test_run_takes_flags_before_the_double_dash_and_the_command_after() -> None:
    args = parse("run", "busybox", "--name", "x", "--gpus", "2", "--", "ls", "-la", "--", "y")
    assert (args.image, args.name, args.gpus, args.command) == (
        "busybox",
        "x",
        2,
        ["ls", "-la", "--", "y"],
    )
    assert parse("run", "busybox", "echo", "hi").command == ["echo", "hi"]


def test_global_options_before_or_after_the_command() -> None:
    before = parse("--server", "http://h:1", "-o", "json", "ps")
    after = parse("ps", "--server", "http://h:1", "-o", "yaml")
    assert (before.server, before.output) == ("http://h:1", "json")
    assert (after.server, after.output) == ("http://h:1", "yaml")
    assert parse("-o", "json", "ps", "-a").output == "json"  # not reset by the subcommand


def test_usage_errors_exit_2() -> None:
    with pytest.raises(SystemExit) as exc:
        parse("run", "busybox", "-d", "-f")
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        parse("logs", "t1", "-n", "0")


def test_task_body_sends_only_what_was_given() -> None:
    args = parse(
        *("run", "ghcr.io/acme/trainer:v2", "--gpus", "1", "--gpu-type", "A100", "--env", "A=1"),
        *("--env", "B=x=y", "--label", "team=ml", "--volume", "/data:/in:ro", "--type"),
        *("training", "--node", "n1", "--preemptible", "--priority", "5", "--", "python t.py"),
    )
    assert commands.task_body(args) == {
        "name": "trainer",
        "image": "ghcr.io/acme/trainer:v2",
        "command": "python t.py",
        "gpu_required": 1,
        "gpu_type": "A100",
        "priority": 5,
        "task_type": "training",
        "requested_node_id": "n1",
        "preemptible": True,
        "env": ["A=1", "B=x=y"],
        "labels": {"team": "ml"},
        "volumes": [{"host_path": "/data", "container_path": "/in", "read_only": True}],
    }
    assert commands.task_body(parse("run", "busybox")) == {"name": "busybox", "image": "busybox"}


@pytest.mark.parametrize(
    "argv",
    [("--env", "NOVALUE"), ("--label", "=v"), ("--volume", "/only-one"), ("--volume", "a:b:rx")],
    ids=["env", "label", "volume-short", "volume-mode"],
)
def test_task_body_names_a_malformed_flag(argv: tuple[str, str]) -> None:
    with pytest.raises(UsageError, match=argv[0]):
        commands.task_body(parse("run", "busybox", *argv))


def test_command_words() -> None:
    assert commands.command_text(["echo hi && exit 3"]) == "echo hi && exit 3"
    assert commands.command_text(["sh", "-c", "echo $X"]) == "sh -c 'echo $X'"
    assert commands.default_name("registry:5000/ns/img@sha256:ab") == "img"


# --- server and credential resolution ---------------------------------------------------------


def pair(target: Target) -> tuple[str, str | None]:
    return target.server, target.token


def test_resolution_order_flags_env_file(tmp_path: Path) -> None:
    creds = {"url": "http://file:3333", "tenant_api_key": "hf_tk_x", "operator_token": "op"}
    (tmp_path / "credentials.json").write_text(json.dumps(creds))
    env = {"HETEROFLOW_HOME": str(tmp_path)}
    assert pair(resolve_target(None, None, env=env)) == ("http://file:3333", "hf_tk_x")
    assert resolve_target(None, None, operator=True, env=env).token == "op"
    env |= {"HETEROFLOW_SERVER": "envhost:1/", "HETEROFLOW_TOKEN": "envtok"}
    assert pair(resolve_target(None, None, env=env)) == ("http://envhost:1", "envtok")
    flags = resolve_target("https://flag/api/v1", "flagtok", env=env)
    assert pair(flags) == ("https://flag", "flagtok")


def test_no_credentials_file_means_default_server_and_no_token(tmp_path: Path) -> None:
    target = resolve_target(None, None, env={"HETEROFLOW_HOME": str(tmp_path)})
    assert (target.server, target.token) == ("http://127.0.0.1:3333", None)
    with pytest.raises(UsageError, match="no credential"):
        Client(target).get("/tasks")


# --- API errors and SSE ---------------------------------------------------------------------


def test_api_errors_carry_code_and_exit_code() -> None:
    body = {"error": "task not found", "code": 40401}
    missing = api_error(httpx.Response(404, json=body))
    assert (str(missing), missing.exit_code, missing.route_missing) == (
        "task not found (code 40401)",
        EXIT_NOT_FOUND,
        False,
    )
    route = api_error(httpx.Response(404, json={"error": "Not Found", "code": 40401}))
    assert route.route_missing
    assert api_error(httpx.Response(403, json={"error": "no", "code": 40301})).exit_code == 1
    crashed = api_error(httpx.Response(502, text="<html>bad gateway</html>"))
    assert crashed.exit_code == EXIT_UNREACHABLE and "HTTP 502" in str(crashed)


def test_parse_sse() -> None:
    lines = [
        "data: one",
        "",
        ": keep-alive comment",
        "data: ",
        "",
        "data:no-space",
        "",
        "event: end",
        'data: {"status": "completed"}',
        "",
    ]
    assert list(parse_sse(lines)) == [
        SseEvent("message", "one"),
        SseEvent("message", ""),
        SseEvent("message", "no-space"),
        SseEvent("end", '{"status": "completed"}'),
    ]


# --- the run-wait loop against a scripted API -------------------------------------------------


class ScriptedApi:
    """Answers GET /tasks/t1 with the next status of a script, and /retries with decisions."""

    def __init__(self, statuses: list[str], decisions: list[str | None]) -> None:
        self.statuses, self.decisions = statuses, decisions

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/retries"):
            return httpx.Response(200, json={"retries": [{"decision": self.decisions.pop(0)}]})
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        retry = 1 if "retried" in status else 0
        return httpx.Response(
            200,
            json={
                "id": "t1",
                "status": status.split(":")[0],
                "retry_count": retry,
                "max_retries": 3,
            },
        )


def scripted_context(
    api: Callable[[httpx.Request], httpx.Response],
) -> tuple[Context, io.StringIO]:
    http = httpx.Client(transport=httpx.MockTransport(api), base_url="http://hf/api/v1")
    err = io.StringIO()
    client = Client(Target("http://hf", "tok", Path("/nonexistent")), _http=http)
    return Context(client, out=io.StringIO(), err=err), err


def test_wait_keeps_going_through_a_failure_the_retry_engine_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(commands, "POLL_S", 0)
    api = ScriptedApi(
        [
            *("running", "failed", "failed", "pending:retried", "pending:retried"),
            *("running:retried", "completed:retried"),
        ],
        [None, "retry: transient error"],
    )
    ctx, err = scripted_context(api)
    final = commands.wait_for(ctx, {"id": "t1", "status": "pending"}, follow=False)
    assert final["status"] == "completed"
    assert (
        err.getvalue()
        == "t1: pending → running → failed → retry 1/3: pending → running → completed\n"
    )


class DeviceFaultApi(ScriptedApi):
    """A one-card task with no retries whose card fails: requeued, then it completes."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        answer = super().__call__(request)
        if request.url.path.endswith("/retries"):
            return answer
        body = answer.json() | {"max_retries": 0, "gpu_ids": ["n1-gpu0"]}
        return httpx.Response(200, json=body)


def test_wait_keeps_going_through_a_device_requeue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands, "POLL_S", 0)
    api = DeviceFaultApi(
        ["running", "failed", "pending", "running", "completed"],
        ["requeue: device fault on n1-gpu0 (xid:79)"],
    )
    ctx, _ = scripted_context(api)
    final = commands.wait_for(ctx, {"id": "t1", "status": "pending"}, follow=False)
    assert final["status"] == "completed"


def test_wait_stops_at_a_failure_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands, "POLL_S", 0)
    ctx, _ = scripted_context(ScriptedApi(["failed"], ["give_up: permanent"]))
    final = commands.wait_for(ctx, {"id": "t1", "status": "running"}, follow=False)
    assert final["status"] == "failed"


# --- operations views -----------------------------------------------------------------------


def test_nodes_table() -> None:
    node = {
        "id": "n1",
        "status": "online",
        "inventory": {
            "memory_mb": 65536,
            "cpu_cores": 16.0,
            "gpus": [{"vendor": "nvidia", "model": "L4"}] * 2,
            "runtime": "docker",
            "userns_remap": True,
        },
        "excluded_gpus": ["n1-gpu1"],
        "quarantined_gpus": [{"gpu_id": "n1-gpu0", "code": "xid:79"}],
    }
    assert events.nodes_table([node]).splitlines() == [
        "ID   STATUS   RUNTIME         GPUS          MEMORY   CPU   EXCLUDED   QUARANTINED",
        "n1   online   docker+userns   nvidia:L4x2   64GiB    16    n1-gpu1    n1-gpu0",
    ]


def test_node_runtime_says_how_the_node_confines_work() -> None:
    def shown(**inventory: object) -> str:
        return out.node_runtime({"inventory": inventory})

    assert shown(runtime="docker") == "docker"
    assert shown(runtime="docker", userns_remap=True) == "docker+userns"
    assert shown(runtime="process", cgroups="v1") == "process+cgroup-v1"
    assert shown(runtime="process", cgroups="v2") == "process+cgroup-v2"
    assert shown(runtime="process", cgroups="none") == "process+no-cgroups"


def test_group_views_show_every_scalar_field_and_members_by_rank() -> None:
    group = {
        "id": "grp-1",
        "name": "ddp",
        "status": "running",
        "task_count": 2,
        "template": {"image": "busybox"},
        "created_at": None,
        "tasks": [task(id="t-b", rank=1), task(id="t-a", rank=0)],
    }
    text = events.group_text(group)
    assert "ID:          grp-1" in text and "Task count:  2" in text
    assert "template" not in text.lower()
    assert text.index("t-a") < text.index("t-b")
    assert events.groups_table([group]).splitlines()[1].split()[:4] == [
        "grp-1",
        "ddp",
        "running",
        "2",
    ]


def test_group_operation_summary() -> None:
    data = {"id": "g", "changed": ["t1"], "skipped": {"t2": "task is not running"}}
    assert commands.members(data) == "changed 1 task(s), skipped 1: t2: task is not running"


def test_timeline_is_read_page_by_page_and_shown_oldest_first() -> None:
    newest_first = [
        {"id": str(i), "kind": f"k{i}", "occurred_at": f"2025-01-02T10:00:0{i}+00:00"}
        for i in (3, 2, 1)
    ]

    def answer(request: httpx.Request) -> httpx.Response:
        page = int(request.url.params["page"])
        batch = newest_first[(page - 1) * 2 : page * 2]
        return httpx.Response(200, json={"events": batch, "total": 3, "page": page})

    ctx, _ = scripted_context(answer)
    timeline = events.fetch_timeline(ctx.client, "/tasks/t1")
    assert [e["kind"] for e in timeline or []] == ["k1", "k2", "k3"]


def test_a_server_without_the_timeline_endpoint_gives_none() -> None:
    ctx, _ = scripted_context(
        lambda _: httpx.Response(404, json={"error": "Not Found", "code": 40401})
    )
    assert events.fetch_timeline(ctx.client, "/tasks/t1") is None
