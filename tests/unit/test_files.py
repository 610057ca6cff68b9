"""Workload files (heteroflow/files): a bad document is refused naming its document, line
and field; YAML 1.2 booleans; how a change to each field is made; the committed JSON Schema
is the generated one and the examples follow it."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from heteroflow.files import kinds
from heteroflow.files.load import Document, FileError, Loader, load, parse_text
from heteroflow.files.schema import render

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "docs" / "schema" / "heteroflow-files.json"
EXAMPLES = ROOT / "examples"

GOOD_TASK = """\
apiVersion: heteroflow/v1
kind: Task
metadata:
  name: first
spec:
  image: busybox:latest
---
"""


def _refusal(text: str) -> FileError:
    with pytest.raises(FileError) as refused:
        for doc in parse_text(text, "f.yaml"):
            kinds.check(doc)
    return refused.value


@pytest.mark.parametrize(
    ("second", "line", "field"),
    [
        (
            "apiVersion: heteroflow/v1\nkind: TaskGroup\nmetadata: {name: g}\nspec:\n"
            "  image: busybox:latest\n  task_count: 2\n  cpu_cores: lots\n",
            14,
            "spec.cpu_cores",
        ),
        (
            "apiVersion: heteroflow/v1\nkind: Task\nmetadata: {name: t}\nspec:\n"
            "  image: busybox:latest\n  gpuz: 1\n",
            13,
            "spec.gpuz",
        ),
        (
            "apiVersion: heteroflow/v1\nkind: Job\nmetadata: {name: j}\nspec:\n  tasks:\n"
            "    - key: a\n      name: a\n    - key: b\n      name: b\n"
            "      memory_mb: -1\n",
            17,
            "spec.tasks.1.memory_mb",
        ),
        (
            "apiVersion: heteroflow/v1\nkind: TaskGroup\nmetadata: {name: g}\nspec:\n"
            "  image: busybox:latest\n  task_count: 2\n  volumes:\n"
            "    - {host_path: data, container_path: /work}\n",
            15,
            "spec.volumes.0.host_path",
        ),
        ("apiVersion: heteroflow/v1\nkind: Deployment\nmetadata: {name: d}\n", 9, "kind"),
        ("apiVersion: v1\nkind: Task\nmetadata: {name: t}\n", 8, "apiVersion"),
        ("apiVersion: heteroflow/v1\nkind: Task\nmetadata: {}\n", 10, "metadata.name"),
        ("apiVersion: heteroflow/v1\nkind: Task\nmetadata: {name: t}\nspek: {}\n", 11, "spek"),
        ("apiVersion: heteroflow/v1\nkind: Task\nmetadata: {name: t\n", 11, "(syntax)"),
    ],
    ids=[
        "group-bad-number",
        "task-unknown-field",
        "job-task-field",
        "group-volume",
        "unknown-kind",
        "api-version",
        "no-name",
        "top-level-typo",
        "yaml-syntax",
    ],
)
def test_a_bad_document_is_refused_naming_document_line_and_field(
    second: str, line: int, field: str
) -> None:
    refused = _refusal(GOOD_TASK + second)
    assert refused.where.startswith("f.yaml, document 2"), str(refused)
    assert (refused.line, refused.field) == (line, field), str(refused)
    assert f"line {line}" in str(refused) and field in str(refused)


def test_the_same_object_twice_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(GOOD_TASK)
    (tmp_path / "b.yaml").write_text(GOOD_TASK)
    with pytest.raises(FileError, match="Task/first is also .*a.yaml, document 1"):
        load([tmp_path])


def test_yaml_reads_scalars_as_yaml_1_2_does() -> None:
    text = "{on: prep, no: yes, t: true, end: 20:00, n: 12, x: 0x1f, f: 1.5, e: 1e3, s: 1_0a}"
    assert yaml.load(text, Loader=Loader) == {
        "on": "prep",
        "no": "yes",
        "t": True,
        "end": "20:00",
        "n": 12,
        "x": 31,
        "f": 1.5,
        "e": 1000.0,
        "s": "1_0a",
    }


def _group(spec: dict[str, Any]) -> Document:
    return Document("g.yaml", 1, "TaskGroup", "web", spec)


LIVE: dict[str, Any] = {
    "name": "web",
    "template": {"name": "web", "image": "srv:1", "task_type": "inference", "cpu_cores": 1.0},
    "task_count": 2,
    "replicas": 2,
    "parallelism": "split",
    "static_world": False,
    "schedule_window": None,
    "auto_scale": None,
}


@pytest.mark.parametrize(
    ("edit", "routed"),
    [
        ({"image": "srv:2"}, {"rollout": {"image": "srv:2"}}),
        ({"env": {"A": "1"}}, {"rollout": {"env": {"A": "1"}}}),
        ({"task_count": 3}, {"scale": 3}),
        ({"idle_timeout_minutes": 5}, {"update": {"idle_timeout_minutes": 5}}),
        (
            {"schedule_window": {"start": "07:00", "end": "19:00", "action": "stop"}},
            {"update": {"schedule_window": {"start": "07:00", "end": "19:00", "action": "stop"}}},
        ),
        ({"cpu_cores": 2}, {"fixed": ["cpu_cores"]}),
        ({"parallelism": "data_parallel"}, {"fixed": ["parallelism"]}),
    ],
    ids=["image", "env", "size", "idle", "window", "cpu", "parallelism"],
)
def test_each_group_change_takes_its_route(edit: dict[str, Any], routed: dict[str, Any]) -> None:
    doc = _group({"image": "srv:1", "task_type": "inference", "task_count": 2} | edit)
    want = kinds.desired(doc)
    plan = kinds.plan(doc, want, kinds.live("TaskGroup", LIVE, want), LIVE)
    assert [c.field for c in plan.changes] == list(edit)
    got = {
        "rollout": plan.rollout,
        "scale": plan.scale,
        "update": plan.update,
        "fixed": plan.fixed,
    }
    assert {k: v for k, v in got.items() if v} == routed


def test_a_static_world_rolls_out_by_recreating_and_an_autoscaled_size_is_left() -> None:
    static = LIVE | {"static_world": True, "template": LIVE["template"] | {"task_type": "training"}}
    doc = _group({"image": "srv:2", "task_type": "training", "task_count": 2})
    want = kinds.desired(doc)
    plan = kinds.plan(doc, want, kinds.live("TaskGroup", static, want), static)
    assert plan.rollout == {"image": "srv:2", "strategy": "recreate"}

    auto = {"metric": "qps", "target": 5, "max_replicas": 4}
    doc = _group({"image": "srv:1", "task_type": "inference", "task_count": 1, "auto_scale": auto})
    want = kinds.desired(doc)
    live = LIVE | {"auto_scale": want["auto_scale"], "replicas": 3}
    plan = kinds.plan(doc, want, kinds.live("TaskGroup", live, want), live)
    assert plan.unchanged and plan.notes


def test_committed_schema_matches_the_models() -> None:
    assert COMMITTED.read_text() == render(), (
        "docs/schema/heteroflow-files.json is stale: run `just files-schema`"
    )


def test_every_example_follows_the_schema_and_the_parsers() -> None:
    validator = Draft202012Validator(json.loads(COMMITTED.read_text()))
    docs = load([EXAMPLES])
    assert {d.kind for d in docs} == {"Task", "TaskGroup", "Job", "Queue", "Pool"}
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for data in yaml.load_all(path.read_text(), Loader=Loader):
            assert not [e.message for e in validator.iter_errors(data)], path
    for doc in docs:
        kinds.check(doc)
    bad = {"apiVersion": "heteroflow/v1", "kind": "Task", "metadata": {"name": "t"}}
    assert list(validator.iter_errors(bad | {"spec": {"image": "x", "gpuz": 1}}))


def test_a_json_file_is_read_with_its_lines() -> None:
    text = (
        '{\n  "apiVersion": "heteroflow/v1",\n  "kind": "Task",\n  "metadata": {"name": "t"},\n'
        '  "spec": {\n    "image": "busybox:latest",\n    "priority": "high"\n  }\n}\n'
    )
    refused = _refusal(text)
    assert (refused.where, refused.line, refused.field) == (
        "f.yaml, document 1 (Task 't')",
        7,
        "spec.priority",
    )


def test_a_task_change_is_an_update_and_a_job_change_is_refused() -> None:
    doc = Document("t.yaml", 1, "Task", "t", {"image": "a:1", "memory_mb": 96})
    live = {"name": "t", "image": "a:1", "memory_mb": 64, "status": "pending"}
    want = kinds.desired(doc)
    plan = kinds.plan(doc, want, kinds.live("Task", live, want), live)
    assert (plan.update, plan.fixed) == ({"memory_mb": 96}, [])

    task = {"key": "a", "name": "a", "image": "a:1"}
    doc = Document("j.yaml", 1, "Job", "j", {"tasks": [task | {"image": "a:2"}]})
    spec = {"tasks": [{"key": "a", "spec": task, "metrics": []}], "dependencies": []}
    want = kinds.desired(doc)
    plan = kinds.plan(doc, want, kinds.live("Job", {"spec": spec}, want), {})
    assert plan.fixed == ["tasks"]


def test_standard_input_is_read_for_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(GOOD_TASK))
    (doc,) = load(["-"])
    assert (doc.source, doc.ref, doc.spec) == ("<stdin>", "Task/first", {"image": "busybox:latest"})


def test_the_command_refuses_a_bad_file_before_calling_anyone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from heteroflow.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        GOOD_TASK + "apiVersion: heteroflow/v1\nkind: Task\nmetadata: {name: b}\n"
        "spec:\n  image: busybox:latest\n  gpuz: 1\n"
    )
    # An address nothing listens on: a call would be exit 3, the refusal is exit 1.
    argv = ["apply", "-f", str(bad), "--server", "http://127.0.0.1:9", "--token", "t"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"error: {bad}, document 2 (Task 'b'), line 13: spec.gpuz: unknown field" in err, err
