"""A job as its events made it, and the cascade: which tasks become ready, which are skipped.

The job is an aggregate (stream `job-…`). Its tasks are ordinary tasks created when they
become ready, carrying the job id and their key in `spec.platform` (server-owned); the job
keeps each node's task id. The job orchestrator records each task's final outcome
(`JobNodeSettled`, with the metrics and artifacts the task reported) when the task's
terminal event arrives, then `advance` decides, from the job alone, which
waiting tasks are now ready (created in the same transaction), which can never run (skipped),
and the job's status. Nothing polls.

A task reports metrics and artifacts in its output (the agent's exit report carries the last
lines): `HF_METRICS {"accuracy": 0.97}` and `HF_ARTIFACT /out/model.pt`, one per line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping

from libs.domain.job.condition import ConditionError, evaluate, parse_condition
from libs.domain.job.events import (
    JobNodeProgress,
    JobNodesSkipped,
    JobStatusChanged,
    JobTasksReady,
    JobWaiting,
)
from libs.domain.job.model import (
    ARTIFACT_MARK,
    DONE,
    METRICS_MARK,
    Job,
    JobNode,
    JobStatus,
    NodeState,
)
from libs.domain.job.spec import Dependency, DependencyKind
from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.task.model import TaskId, TaskSpec
from libs.domain.task.states import TaskStatus

# --- readiness -------------------------------------------------------------------------

Verdict = tuple[str, str]  # ("ok" | "wait" | "never", why)


def readiness(dep: Dependency, upstream: JobNode) -> Verdict:
    """Whether `dep` is met by its upstream node as it stands (the four kinds of seed 004)."""
    on, state = dep.on, upstream.state
    if dep.kind is DependencyKind.RESOURCE:
        if state in DONE:
            return ("ok", "")
        return ("wait", f"waiting for {on!r} to release its resources")
    if dep.kind is DependencyKind.DATA:
        if dep.artifact in upstream.artifacts:
            return ("ok", "")
        if state in DONE:
            return ("never", f"{on!r} ended ({state.value}) without artifact {dep.artifact!r}")
        return ("wait", f"waiting for {on!r} to report artifact {dep.artifact!r}")
    if state in (NodeState.FAILED, NodeState.STOPPED, NodeState.SKIPPED):
        return ("never", f"{on!r} ended {state.value}")
    if state is not NodeState.COMPLETED:
        return ("wait", f"waiting for {on!r} to complete")
    if dep.kind is DependencyKind.AFTER:
        return ("ok", "")
    try:
        holds = evaluate(parse_condition(dep.condition), upstream.metrics)
    except ConditionError as exc:
        return ("never", f"condition {dep.condition!r} on {on!r}: {exc}")
    if holds:
        return ("ok", "")
    return ("never", f"condition {dep.condition!r} on {on!r} is false")


def node_readiness(job: Job, key: str, nodes: Mapping[str, JobNode]) -> Verdict:
    """All of a node's dependencies together: never if one never holds, wait if one waits."""
    waits: list[str] = []
    for dep in job.spec.upstream(key):
        verdict, why = readiness(dep, nodes[dep.on])
        if verdict == "never":
            return ("never", why)
        if verdict == "wait":
            waits.append(why)
    return ("wait", "; ".join(waits)) if waits else ("ok", "")


# --- the cascade -----------------------------------------------------------------------


def advance(job: Job) -> tuple[list[Payload], list[str]]:
    """The events that bring `job` up to date, and the keys whose tasks to create now."""
    nodes = dict(job.nodes)
    ready: list[str] = []
    skipped: dict[str, str] = {}
    changed = True
    while changed:  # a skip can make a resource dependency ready, or skip further tasks
        changed = False
        for spec in job.spec.tasks:
            node = nodes[spec.key]
            if node.state is not NodeState.WAITING:
                continue
            verdict, why = (
                ("never", "the job was stopped")
                if job.stop_requested
                else (node_readiness(job, spec.key, nodes))
            )
            if verdict == "ok":
                ready.append(spec.key)
                nodes[spec.key] = node.model_copy(update={"state": NodeState.CREATED})
                changed = True
            elif verdict == "never":
                skipped[spec.key] = why
                nodes[spec.key] = node.model_copy(update={"state": NodeState.SKIPPED})
                changed = True
    events: list[Payload] = []
    if ready:
        events.append(JobTasksReady(job_id=job.id, keys=tuple(ready)))
    if skipped:
        events.append(JobNodesSkipped(job_id=job.id, reasons=skipped))
    waiting = {
        k: why
        for k, n in nodes.items()
        if n.state is NodeState.WAITING
        and (why := node_readiness(job, k, nodes)[1]) != job.nodes[k].reason
    }
    if waiting:
        events.append(JobWaiting(job_id=job.id, reasons=waiting))
    events.extend(status_events(job, nodes))
    return events, ready


def tolerated(job: Job, key: str, nodes: Mapping[str, JobNode]) -> bool:
    """A failed task whose every dependant consumed it through data or resource (and so
    went on) does not fail the job."""
    down = job.spec.downstream(key)
    return bool(down) and all(
        d.kind in (DependencyKind.DATA, DependencyKind.RESOURCE)
        and nodes[d.task].state is not NodeState.SKIPPED
        for d in down
    )


def job_status(job: Job, nodes: Mapping[str, JobNode]) -> tuple[JobStatus, ReasonCode, str]:
    """The job's status, the code and the text of why: `running` once a task holds resources
    (admitted and placed), `pending` with the binding reason while every unfinished task waits
    for admission, placement or its dependencies (Kueue's not admitted, Slurm's PD)."""
    states = [n.state for n in nodes.values()]
    if job.stop_requested and all(s in DONE for s in states):
        return JobStatus.STOPPED, ReasonCode.MEMBERS_CHANGED, "stopped on request"
    if not all(s in DONE for s in states):
        if any(n.holding for n in nodes.values()):
            return JobStatus.RUNNING, ReasonCode.MEMBERS_CHANGED, ""
        return (JobStatus.PENDING, *waiting_reason(job, nodes))
    bad = sorted(
        k
        for k, n in nodes.items()
        if n.state in (NodeState.FAILED, NodeState.STOPPED) and not tolerated(job, k, nodes)
    )
    if bad:
        return (
            JobStatus.FAILED,
            ReasonCode.MEMBERS_CHANGED,
            f"task(s) {', '.join(bad)} did not complete",
        )
    return JobStatus.SUCCEEDED, ReasonCode.MEMBERS_CHANGED, "every task completed or was skipped"


def waiting_reason(job: Job, nodes: Mapping[str, JobNode]) -> tuple[ReasonCode, str]:
    """Why a job none of whose tasks holds resources waits: the pending reason of its first
    created task that has one (in the job's order), else that its tasks await placement."""
    created = [k for k in (t.key for t in job.spec.tasks) if nodes[k].state is NodeState.CREATED]
    for key in created:
        node = nodes[key]
        if node.pending_code is not None:
            return node.pending_code, f"task {key!r}: {node.pending_reason}"
    if created:
        return ReasonCode.SUBMITTED, f"task(s) {', '.join(created)} waiting for placement"
    return ReasonCode.SUBMITTED, "waiting for dependencies"


def status_events(job: Job, nodes: Mapping[str, JobNode]) -> list[Payload]:
    """The status change `nodes` make to `job`: a new status, or while pending a new reason."""
    status, code, reason = job_status(job, nodes)
    same = status is job.status and (
        status is not JobStatus.PENDING or (code, reason) == (job.reason_code, job.reason)
    )
    if same:
        return []
    return [
        JobStatusChanged(
            job_id=job.id,
            from_status=job.status,
            to_status=status,
            reason_code=code,
            reason=reason,
        )
    ]


def progress(job: Job, heard: JobNodeProgress) -> list[Payload]:
    """News of a created task (its status, or why it waits) and the status change it makes;
    nothing when it is old news, or about a task that is not the node's (idempotent)."""
    node = job.nodes.get(heard.key)
    if (
        node is None
        or node.state is not NodeState.CREATED
        or node.task_id not in ("", heard.task_id)  # "": ready before task ids were kept
        or heard.task_version <= node.task_version
    ):
        return []
    pending = heard.task_status is TaskStatus.PENDING
    code, why = (heard.reason_code, heard.reason) if pending else (None, "")
    if node.holding == (not pending) and (node.pending_code, node.pending_reason) == (code, why):
        return []  # changes nothing the job shows (scheduled -> running, a repeated reason)
    nodes = dict(job.nodes)
    nodes[heard.key] = node.model_copy(
        update={"task_status": heard.task_status, "pending_code": code, "pending_reason": why}
    )
    return [heard, *status_events(job, nodes)]


def cascade(
    job: Job, new_id: Callable[[], TaskId]
) -> tuple[list[Payload], list[tuple[TaskId, TaskSpec]]]:
    """`advance` with the tasks it makes ready: its events, with the id `new_id` chose for
    each ready key's task recorded in `JobTasksReady` (the only task whose end settles that
    node), and each of those tasks as (id, spec) to create in the same transaction."""
    events, ready = advance(job)
    ids = {k: new_id() for k in ready}
    events = [
        ev.model_copy(update={"task_ids": {k: ids[k] for k in ev.keys}})
        if isinstance(ev, JobTasksReady)
        else ev
        for ev in events
    ]
    return events, [(ids[k], task_spec(job, k)) for k in ready]


def task_spec(job: Job, key: str) -> TaskSpec:
    """The task to create for `key`: its spec, in the job's queue, marked with the job."""
    spec = job.spec.node(key).spec
    platform = spec.platform.model_copy(update={"job_id": job.id, "job_key": key})
    name = f"{job.spec.name}-{key}"[:100]
    return spec.model_copy(update={"platform": platform, "queue": job.spec.queue, "name": name})


def parse_report(output: str) -> tuple[dict[str, float], tuple[str, ...]]:
    """Metrics and artifacts a task reported in its output (the last lines the agent sent).
    Malformed lines are ignored: they are the task's output, not ours to refuse."""
    metrics: dict[str, float] = {}
    artifacts: list[str] = []
    for line in output.splitlines():
        line = line.strip()
        if line.startswith(METRICS_MARK):
            try:
                data = json.loads(line.removeprefix(METRICS_MARK))
            except ValueError:
                continue
            if isinstance(data, dict):
                metrics.update(
                    {
                        str(k): float(v)
                        for k, v in data.items()
                        if isinstance(v, int | float)
                        and not isinstance(v, bool)
                        and math.isfinite(v)
                    }
                )
        elif line.startswith(ARTIFACT_MARK):
            path = line.removeprefix(ARTIFACT_MARK).strip()
            if path.startswith("/") and path not in artifacts:
                artifacts.append(path)
    return metrics, tuple(artifacts)
