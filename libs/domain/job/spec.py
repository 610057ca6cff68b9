"""Jobs (SPEC §7, seed 004): a user-visible DAG of tasks, and its validation at submission.

A job names its tasks by job-local `key` and links them by dependencies of four kinds:

* `after`     (hard): the task becomes ready when `on` completed;
* `data`:      it runs once `on` reported its declared `artifact` complete, even if `on`
               then failed;
* `resource`:  it waits until `on` released its cards (ended), whatever the outcome;
* `condition`: it runs when `on` completed and `condition` holds over `on`'s reported
               metrics (condition.py); otherwise it is skipped.

`parse_job` collects every problem of a submission (unknown fields, invalid task specs,
unknown or repeated keys, cycles named in order, conditions on tasks that declare no metrics,
requests beyond the queue's quota) and refuses it in one answer.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from libs.domain.errors import Code, DomainError
from libs.domain.job.condition import ConditionError, parse_condition
from libs.domain.task.model import TaskSpec, parse_create

KEY_PATTERN = r"^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$"
MAX_TASKS = 200
JOB_FIELDS = frozenset({"name", "queue", "tasks", "dependencies"})
NODE_FIELDS = frozenset({"key", "metrics", "artifacts"})
DEP_FIELDS = frozenset({"task", "on", "kind", "artifact", "condition"})


class DependencyKind(StrEnum):
    AFTER = "after"
    DATA = "data"
    RESOURCE = "resource"
    CONDITION = "condition"


class Dependency(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    task: str  # the task that waits
    on: str  # the task it waits for
    kind: DependencyKind = DependencyKind.AFTER
    artifact: str = ""  # data: the path `on` reports complete
    condition: str = ""  # condition: over `on`'s metrics


class JobNodeSpec(BaseModel):
    """One task of the job: its key, its task spec, and what it reports."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str = Field(pattern=KEY_PATTERN)
    spec: TaskSpec
    metrics: tuple[str, ...] = ()  # names it reports (conditions may read only these)


class JobSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=100)
    queue: str = ""
    tasks: tuple[JobNodeSpec, ...]
    dependencies: tuple[Dependency, ...] = ()

    def node(self, key: str) -> JobNodeSpec:
        return next(n for n in self.tasks if n.key == key)

    def upstream(self, key: str) -> list[Dependency]:
        return [d for d in self.dependencies if d.task == key]

    def downstream(self, key: str) -> list[Dependency]:
        return [d for d in self.dependencies if d.on == key]


# --- validation ------------------------------------------------------------------------


class Problems:
    """Every problem of one submission, each with the field it is about."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []
        self.unknown_only = True
        self.owned_only = True  # every problem is a server-owned field or name (40002)

    def add(self, field: str, message: str, *, unknown: bool = False, owned: bool = False) -> None:
        self.items.append((field, message))
        self.unknown_only = self.unknown_only and unknown
        self.owned_only = self.owned_only and owned

    def raise_any(self) -> None:
        if not self.items:
            return
        fields = list(dict.fromkeys(f for f, _ in self.items))
        text = "; ".join(f"{f}: {m}" for f, m in self.items)
        code = Code.UNKNOWN_FIELD if self.unknown_only else Code.INVALID_VALUE
        if self.owned_only:
            code = Code.SERVER_OWNED_FIELD
        raise DomainError(code, f"invalid job: {text}", fields)


def find_cycle(keys: Sequence[str], edges: Iterable[tuple[str, str]]) -> list[str] | None:
    """A cycle as [a, b, ..., a] following `on -> task` edges, or None (iterative DFS)."""
    after: dict[str, list[str]] = {k: [] for k in keys}
    for on, task in edges:
        if on in after and task in after:
            after[on].append(task)
    colour = dict.fromkeys(keys, 0)  # 0 new, 1 on the path, 2 done
    for root in keys:
        if colour[root]:
            continue
        path, stack = [root], [iter(after[root])]
        colour[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                colour[path.pop()] = 2
                stack.pop()
            elif colour[nxt] == 1:
                return [*path[path.index(nxt) :], nxt]
            elif colour[nxt] == 0:
                colour[nxt] = 1
                path.append(nxt)
                stack.append(iter(after[nxt]))
    return None


def _parse_node(
    i: int,
    raw: Any,
    problems: Problems,
    *,
    tenant: bool,
    allow: Sequence[str],
    defaults: Mapping[str, Any] | None = None,
) -> JobNodeSpec | None:
    where = f"tasks[{i}]"
    if not isinstance(raw, Mapping):
        problems.add(where, "must be an object with a key and a task spec")
        return None
    key, metrics = raw.get("key"), raw.get("metrics", [])
    task_raw = {k: v for k, v in raw.items() if k not in NODE_FIELDS}
    if "queue" in task_raw:
        problems.add(f"{where}.queue", "a job's tasks run in the job's queue", unknown=True)
        task_raw.pop("queue")
    try:
        spec = parse_create(task_raw, tenant=tenant, volume_allow_list=allow, defaults=defaults)
    except DomainError as exc:
        for field in exc.fields or ["body"]:
            problems.add(
                f"{where}.{field}",
                exc.message,
                unknown=exc.code is Code.UNKNOWN_FIELD,
                owned=exc.code is Code.SERVER_OWNED_FIELD,
            )
        return None
    if not isinstance(metrics, list) or not all(isinstance(m, str) and m for m in metrics):
        problems.add(f"{where}.metrics", "must be a list of metric names")
        return None
    try:
        return JobNodeSpec(key=key, spec=spec, metrics=tuple(metrics))
    except ValueError:
        problems.add(f"{where}.key", f"key {key!r} must match {KEY_PATTERN}")
        return None


def _parse_dep(i: int, raw: Any, problems: Problems) -> Dependency | None:
    where = f"dependencies[{i}]"
    if not isinstance(raw, Mapping):
        problems.add(where, "must be an object {task, on, kind, ...}")
        return None
    unknown = sorted(set(raw) - DEP_FIELDS)
    if unknown:
        problems.add(f"{where}", f"unknown field(s): {', '.join(unknown)}", unknown=True)
        return None
    try:
        return Dependency.model_validate(raw)
    except ValueError as exc:
        problems.add(where, str(exc).splitlines()[-1].strip() or "invalid dependency")
        return None


def _check_dep(
    i: int, dep: Dependency, nodes: Mapping[str, JobNodeSpec], problems: Problems
) -> None:
    where = f"dependencies[{i}]"
    for side in ("task", "on"):
        if getattr(dep, side) not in nodes:
            problems.add(f"{where}.{side}", f"unknown task key {getattr(dep, side)!r}")
    if dep.task == dep.on:
        problems.add(where, f"task {dep.task!r} depends on itself")
    upstream = nodes.get(dep.on)
    if dep.kind is DependencyKind.CONDITION:
        _check_condition(where, dep, upstream, problems)
    elif dep.condition:
        problems.add(f"{where}.condition", "only a condition dependency has a condition")
    if dep.kind is DependencyKind.DATA:
        _check_artifact(where, dep, upstream, problems)
    elif dep.artifact:
        problems.add(f"{where}.artifact", "only a data dependency has an artifact")


def _check_condition(
    where: str, dep: Dependency, upstream: JobNodeSpec | None, problems: Problems
) -> None:
    try:
        cond = parse_condition(dep.condition)
    except ConditionError as exc:
        problems.add(f"{where}.condition", str(exc))
        return
    if upstream is None:
        return
    if not upstream.metrics:
        problems.add(
            f"{where}.condition",
            f'task {dep.on!r} declares no metrics (add "metrics": [...] to it)',
        )
        return
    unknown = sorted(cond.names - set(upstream.metrics))
    if unknown:
        problems.add(
            f"{where}.condition",
            f"task {dep.on!r} does not report metric(s) {', '.join(unknown)}",
        )


def _check_artifact(
    where: str, dep: Dependency, upstream: JobNodeSpec | None, problems: Problems
) -> None:
    path = posixpath.normpath(dep.artifact) if dep.artifact else ""
    if not path.startswith("/") or ".." in dep.artifact.split("/"):
        problems.add(f"{where}.artifact", "a data dependency names an absolute artifact path")
        return
    if upstream is None:
        return
    roots = [v.container_path for v in upstream.spec.volumes if not v.read_only]
    if not any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots):
        problems.add(
            f"{where}.artifact",
            f"{dep.artifact!r} is not under a writable volume of task {dep.on!r}",
        )


def check_quota(
    nodes: Mapping[int, JobNodeSpec], queue: str, max_gpus: int, problems: Problems
) -> None:
    """`nodes` by their index in the submission."""
    if not max_gpus:
        return
    for i, node in nodes.items():
        if node.spec.gpu_required > max_gpus:
            problems.add(
                f"tasks[{i}].gpu_required",
                f"task {node.key!r} needs {node.spec.gpu_required} GPUs: over queue "
                f"{queue!r} quota max_gpus {max_gpus}",
            )
        for v, var in enumerate(node.spec.variants):  # docs/scheduling.md#variants
            if var.gpu_required > max_gpus:
                problems.add(
                    f"tasks[{i}].variants.{v}.gpu_required",
                    f"task {node.key!r} variants[{v}] needs {var.gpu_required} GPUs: over "
                    f"queue {queue!r} quota max_gpus {max_gpus}",
                )


def parse_job(
    raw: Any,
    *,
    tenant: bool,
    volume_allow_list: Iterable[str] = (),
    queue_max_gpus: int = 0,
    queue: str = "",
    queue_problem: str = "",
    defaults: Mapping[str, Any] | None = None,
) -> JobSpec:
    """Validate a job submission, naming every problem in one DomainError (`queue_problem`:
    what the caller found wrong with the queue, reported with the rest)."""
    if not isinstance(raw, Mapping):
        raise DomainError(Code.INVALID_VALUE, "request body must be a JSON object", ["body"])
    problems = Problems()
    if queue_problem:
        problems.add("queue", queue_problem)
    for field in sorted(set(raw) - JOB_FIELDS):
        problems.add(field, "unknown field", unknown=True)
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 100:
        problems.add("name", "a job needs a name of 1-100 characters")
    tasks_raw, deps_raw = raw.get("tasks"), raw.get("dependencies", [])
    if not isinstance(tasks_raw, list) or not 1 <= len(tasks_raw) <= MAX_TASKS:
        problems.add("tasks", f"a job has 1-{MAX_TASKS} tasks")
        tasks_raw = []
    if not isinstance(deps_raw, list):
        problems.add("dependencies", "must be a list")
        deps_raw = []
    allow = list(volume_allow_list)
    nodes: dict[str, JobNodeSpec] = {}
    by_index: dict[int, JobNodeSpec] = {}
    for i, item in enumerate(tasks_raw):
        node = _parse_node(i, item, problems, tenant=tenant, allow=allow, defaults=defaults)
        if node is not None and node.key in nodes:
            problems.add(f"tasks[{i}].key", f"key {node.key!r} is used twice")
        elif node is not None:
            nodes[node.key] = by_index[i] = node
    deps = [d for i, r in enumerate(deps_raw) if (d := _parse_dep(i, r, problems)) is not None]
    for i, dep in enumerate(deps):
        _check_dep(i, dep, nodes, problems)
    cycle = find_cycle(list(nodes), ((d.on, d.task) for d in deps))
    if cycle:
        problems.add("dependencies", f"cycle: {' -> '.join(cycle)}")
    check_quota(by_index, queue, queue_max_gpus, problems)
    problems.raise_any()
    return JobSpec(
        name=str(name), queue=queue, tasks=tuple(nodes.values()), dependencies=tuple(deps)
    )
