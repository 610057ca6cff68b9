"""What each kind of document means to the API, as pure functions: the create body, the
local check (the domain's own parsers), the comparable form of the file and of the live
object, the plan of a change (update, scale, rollout, or not in place) and the document
that `heteroflow get` writes back."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from libs.domain.errors import DomainError
from libs.domain.group.model import GROUP_FIELDS, POLICY_KEYS, GroupShape, parse_group
from libs.domain.job.spec import Dependency, parse_job
from libs.domain.pool.decide import parse_pool, parse_queue
from libs.domain.pool.model import PoolSpec, QueueSpec
from libs.domain.task.model import TaskSpec, parse_create

from .load import API_VERSION, Document

# The file is checked here for shape and values; which host paths a tenant may mount is the
# server's to say (its allow-list is not known to the client), so every absolute path passes.
ALLOW_ANY_PATH = ("/",)
ROLLOUT_FIELDS = frozenset({"image", "env", "volumes"})
GROUP_UPDATABLE = frozenset({"idle_timeout_minutes"}) | POLICY_KEYS
PATHS = {
    "Task": "/tasks",
    "TaskGroup": "/task-groups",
    "Job": "/jobs",
    "Queue": "/queues",
    "Pool": "/pools",
}
_DEFAULT_TASK = TaskSpec(name="x").model_dump(mode="json", exclude={"platform", "name"})
_DEFAULT_SHAPE = GroupShape(task_count=1).model_dump(mode="json")


def body_of(doc: Document) -> dict[str, Any]:
    """The API's create body: the spec with the name from metadata."""
    return {**doc.spec, "name": doc.name}


def api_field(name: str) -> str:
    """`tasks[1].image` (the job parser's spelling) as `tasks.1.image`."""
    return re.sub(r"\[(\d+)\]", r".\1", name)


def check(doc: Document) -> None:
    """Refuse a document the domain's parsers refuse, naming its line and field."""
    body = body_of(doc)
    try:
        if doc.kind == "Task":
            parse_create(body, tenant=True, volume_allow_list=ALLOW_ANY_PATH)
        elif doc.kind == "TaskGroup":
            parse_group(body, tenant=True, volume_allow_list=ALLOW_ANY_PATH)
        elif doc.kind == "Job":
            parse_job(body, tenant=True, volume_allow_list=ALLOW_ANY_PATH)
        elif doc.kind == "Queue":
            parse_queue(body)
        else:
            parse_pool(body)
    except DomainError as exc:
        first = api_field(exc.fields[0]) if exc.fields else ""
        raise doc.error(first, exc.message) from None


def _task_form(spec: TaskSpec, keys: set[str]) -> dict[str, Any]:
    dumped = spec.model_dump(mode="json", exclude={"platform"})
    return {k: dumped[k] for k in sorted(keys) if k in dumped}


def _task_keys(raw: Mapping[str, Any]) -> set[str]:
    keys = set(raw) - {"gpu_count"}
    return keys | ({"gpu_required"} if "gpu_count" in raw else set())


def live_task_spec(view: Mapping[str, Any]) -> TaskSpec:
    """The spec a task (or a group's template) holds, from its API view."""
    fields = {k: view[k] for k in TaskSpec.model_fields if k in view and k != "platform"}
    return TaskSpec.model_validate(fields)


# --- the comparable forms: {field: value} of what the file sets --------------------------


def desired(doc: Document) -> dict[str, Any]:
    """The file's values, as the domain normalises them, of the fields the file sets."""
    body = body_of(doc)
    if doc.kind == "Task":
        spec = parse_create(body, tenant=True, volume_allow_list=ALLOW_ANY_PATH)
        return _task_form(spec, _task_keys(body))
    if doc.kind == "TaskGroup":
        group = parse_group(body, tenant=True, volume_allow_list=ALLOW_ANY_PATH)
        task_keys = _task_keys({k: v for k, v in body.items() if k not in GROUP_FIELDS})
        out = _task_form(group.template, task_keys - POLICY_KEYS)
        shape = group.shape.model_dump(mode="json")
        out |= {k: shape[k] for k in sorted(GROUP_FIELDS & set(body))}
        for key in sorted(POLICY_KEYS & set(body)):
            value = getattr(group, key)
            out[key] = value.model_dump(mode="json") if value is not None else None
        return out
    if doc.kind == "Job":
        job = parse_job(body, tenant=True, volume_allow_list=ALLOW_ANY_PATH)
        tasks = []
        for raw, node in zip(body.get("tasks") or [], job.tasks, strict=False):
            keys = _task_keys({k: v for k, v in raw.items() if k not in ("key", "metrics")})
            tasks.append(
                {"key": node.key, "metrics": list(node.metrics)} | _task_form(node.spec, keys)
            )
        out = {"tasks": tasks, "dependencies": _deps(job.dependencies)}
        if "queue" in body:
            out["queue"] = body["queue"]
        return out
    if doc.kind == "Queue":
        return parse_queue(body).model_dump(mode="json", exclude={"name"})
    return parse_pool(body).model_dump(mode="json", exclude={"name"})


def _deps(deps: tuple[Dependency, ...] | list[Dependency]) -> list[dict[str, Any]]:
    return [d.model_dump(mode="json", exclude_defaults=True) for d in deps]


def live(kind: str, view: Mapping[str, Any], want: Mapping[str, Any]) -> dict[str, Any]:
    """The live object's values of the fields in `want` (its desired form)."""
    if kind == "Task":
        return _task_form(live_task_spec(view), set(want))
    if kind == "TaskGroup":
        out = _task_form(live_task_spec(view["template"]), set(want) - GROUP_FIELDS - POLICY_KEYS)
        for key in sorted(GROUP_FIELDS & set(want)):
            out[key] = view.get("replicas") if key == "task_count" else view.get(key)
        for key in sorted(POLICY_KEYS & set(want)):
            out[key] = view.get(key)
        return out
    if kind == "Job":
        spec = view.get("spec") or {}
        by_key = {t["key"]: t for t in spec.get("tasks") or []}
        tasks = []
        for wanted in want.get("tasks") or []:
            node = by_key.get(wanted["key"])
            if node is None:
                tasks.append({"key": wanted["key"], "missing": True})
                continue
            keys = set(wanted) - {"key", "metrics"}
            tasks.append(
                {"key": node["key"], "metrics": list(node.get("metrics") or [])}
                | (_task_form(live_task_spec(node["spec"]), keys))
            )
        if len(by_key) != len(want.get("tasks") or []):
            tasks.append({"tasks": sorted(by_key)})
        deps = [Dependency.model_validate(d) for d in spec.get("dependencies") or []]
        out = {"tasks": tasks, "dependencies": _deps(deps)}
        if "queue" in want:
            out["queue"] = spec.get("queue", view.get("queue"))
        return out
    model = QueueSpec if kind == "Queue" else PoolSpec
    fields = {k: view[k] for k in model.model_fields if k in view}
    return model.model_validate(fields).model_dump(mode="json", exclude={"name"})


# --- changes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    field: str
    before: Any
    after: Any


@dataclass
class Plan:
    """What applying one document to its live object takes."""

    changes: list[Change] = field(default_factory=list)
    update: dict[str, Any] = field(default_factory=dict)  # PUT body
    rollout: dict[str, Any] = field(default_factory=dict)  # POST .../rollout body
    scale: int | None = None  # POST .../scale replicas
    fixed: list[str] = field(default_factory=list)  # fields that cannot change in place
    notes: list[str] = field(default_factory=list)

    @property
    def unchanged(self) -> bool:
        return not self.changes


def diff(want: Mapping[str, Any], have: Mapping[str, Any]) -> list[Change]:
    return [Change(k, have.get(k), v) for k, v in want.items() if have.get(k) != v]


def plan(
    doc: Document, want: dict[str, Any], have: dict[str, Any], view: Mapping[str, Any]
) -> Plan:
    """The changes and how each is made (the API routes a kind has)."""
    out = Plan(changes=diff(want, have))
    if (
        doc.kind == "TaskGroup"
        and "task_count" in want
        and (want.get("auto_scale") or ("auto_scale" not in want and view.get("auto_scale")))
    ):
        # The autoscaler owns the size of an autoscaled group: the file's count is its start.
        if any(c.field == "task_count" for c in out.changes):
            out.notes.append("task_count left to the autoscaler (auto_scale is set)")
        out.changes = [c for c in out.changes if c.field != "task_count"]
    for change in out.changes:
        _route(doc, change, out, view)
    return out


def _route(doc: Document, change: Change, out: Plan, view: Mapping[str, Any]) -> None:
    name, raw = change.field, body_of(doc)
    if doc.kind == "Task":
        out.update[name] = raw.get(name, raw.get("gpu_count") if name == "gpu_required" else None)
    elif doc.kind == "TaskGroup":
        if name in ROLLOUT_FIELDS:
            out.rollout[name] = change.after
        elif name in GROUP_UPDATABLE:
            out.update[name] = raw.get(name)
        elif name == "task_count" and not view.get("static_world"):
            out.scale = int(change.after)
        else:
            out.fixed.append(name)
    elif doc.kind == "Job":
        out.fixed.append(name)
    else:  # queues and pools take the whole document again
        out.update = {k: v for k, v in raw.items() if k != "name"}
    if out.rollout and view.get("static_world"):
        out.rollout["strategy"] = "recreate"  # a fixed world restarts whole (docs/rollout.md)


# --- documents written back ----------------------------------------------------------------


def _lean_task(spec: TaskSpec) -> dict[str, Any]:
    dumped = spec.model_dump(mode="json", exclude={"platform", "name"})
    return {k: v for k, v in dumped.items() if v != _DEFAULT_TASK.get(k)}


def document_of(kind: str, name: str, view: Mapping[str, Any]) -> dict[str, Any]:
    """A file that applies cleanly over the object `view` shows: the fields that are not
    the model's defaults, in the file's shape."""
    spec: dict[str, Any]
    if kind == "Task":
        spec = _lean_task(live_task_spec(view))
    elif kind == "TaskGroup":
        spec = _lean_task(live_task_spec(view["template"]))
        spec |= {
            k: view[k]
            for k in sorted(GROUP_FIELDS)
            if k in view and k != "task_count" and view[k] != _DEFAULT_SHAPE.get(k)
        }
        spec["task_count"] = view["task_count"] if view.get("auto_scale") else view["replicas"]
        spec |= {k: view[k] for k in sorted(POLICY_KEYS) if view.get(k) is not None}
    elif kind == "Job":
        job = view.get("spec") or {}
        tasks = []
        for node in job.get("tasks") or []:
            task = {"key": node["key"], "name": node["spec"]["name"]}
            if node.get("metrics"):
                task["metrics"] = list(node["metrics"])
            tasks.append(task | _lean_task(live_task_spec(node["spec"])))
        spec = {"queue": job["queue"]} if job.get("queue") else {}
        spec |= {"tasks": tasks}
        deps = [Dependency.model_validate(d) for d in job.get("dependencies") or []]
        if deps:
            spec["dependencies"] = _deps(deps)
    else:
        spec = live(kind, view, {})
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": name}, "spec": spec}
