"""Jobs: DAG validation, the condition language, readiness of the four dependency kinds, and
the cascade that creates, skips and settles (seed 004, SPEC §7)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

import pytest

from libs.domain.errors import Code, DomainError
from libs.domain.job.condition import ConditionError, evaluate, parse_condition
from libs.domain.job.decide import advance, parse_report, readiness
from libs.domain.job.events import JobNodeSettled, JobStopRequested, JobSubmitted
from libs.domain.job.evolve import evolve_job
from libs.domain.job.model import Job, JobNode, JobStatus, NodeState
from libs.domain.job.spec import Dependency, DependencyKind, find_cycle, parse_job
from libs.domain.reasons import ReasonCode
from libs.domain.task.events import (
    TaskCreated,
    TaskPendingReason,
    TaskRetryDecided,
    TaskStatusChanged,
)
from libs.domain.task.model import Platform, TaskId, TaskSpec, TenantId
from libs.domain.task.states import TaskStatus
from libs.store.eventstore import EventStore
from services.job_orchestrator.handlers.task_ended import (
    Orchestrator,
    retry_outcome,
    status_outcome,
)
from tests.envelopes import envelope

NOW = datetime(2026, 1, 1, tzinfo=UTC)
ALLOW = ["/data"]
VOL = [{"host_path": "/data/j", "container_path": "/work"}]


def task(key: str, **extra: Any) -> dict[str, Any]:
    return {"key": key, "name": key, "image": "busybox:latest"} | extra


def job(tasks: list[dict[str, Any]], deps: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"name": "j", "tasks": tasks, "dependencies": deps} | extra


def refusal(body: dict[str, Any], **kw: Any) -> DomainError:
    with pytest.raises(DomainError) as err:
        parse_job(body, tenant=True, volume_allow_list=ALLOW, **kw)
    return err.value


# --- validation --------------------------------------------------------------------------

CHAIN = [task("a"), task("b"), task("c")]

INVALID = [
    (
        job(CHAIN, [{"task": "b", "on": "a"}, {"task": "c", "on": "b"}, {"task": "a", "on": "c"}]),
        ["cycle: a -> b -> c -> a"],
        "cycle-named-in-order",
    ),
    (job(CHAIN, [{"task": "a", "on": "a"}]), ["depends on itself"], "self-loop"),
    (
        job(CHAIN, [{"task": "b", "on": "zz"}, {"task": "yy", "on": "a"}]),
        ["unknown task key 'zz'", "unknown task key 'yy'"],
        "unknown-keys-all-named",
    ),
    (job([task("a"), task("a")], []), ["key 'a' is used twice"], "duplicate-key"),
    (
        job(CHAIN, [{"task": "b", "on": "a", "kind": "condition", "condition": "acc > 1"}]),
        ["task 'a' declares no metrics"],
        "condition-on-task-without-metrics",
    ),
    (
        job(
            [task("a", metrics=["loss"]), task("b")],
            [{"task": "b", "on": "a", "kind": "condition", "condition": "acc > 1"}],
        ),
        ["does not report metric(s) acc"],
        "condition-on-undeclared-metric",
    ),
    (
        job(
            [task("a", metrics=["acc"]), task("b")],
            [{"task": "b", "on": "a", "kind": "condition", "condition": "__import__('os')"}],
        ),
        ["Call is not allowed"],
        "condition-refuses-a-call",
    ),
    (
        job([task("a"), task("b")], [{"task": "b", "on": "a", "kind": "data"}]),
        ["absolute artifact path"],
        "data-without-artifact",
    ),
    (
        job(
            [task("a", volumes=VOL), task("b")],
            [{"task": "b", "on": "a", "kind": "data", "artifact": "/elsewhere/x"}],
        ),
        ["not under a writable volume of task 'a'"],
        "artifact-outside-the-volumes",
    ),
    (job([task("a", gpus=1)], []), ["tasks[0].gpus"], "bad-task-field-named"),
    (job(CHAIN, [], owner="me"), ["owner: unknown field"], "unknown-job-field"),
    (job(CHAIN, [{"task": "b", "on": "a", "kind": "soon"}]), ["dependencies[0]"], "bad-kind"),
]


@pytest.mark.parametrize(("body", "needles"), [c[:2] for c in INVALID], ids=[c[2] for c in INVALID])
def test_invalid_jobs_are_refused_naming_the_problem(
    body: dict[str, Any], needles: list[str]
) -> None:
    err = refusal(body)
    for needle in needles:
        assert needle in err.message, err.message


def test_every_problem_in_one_answer() -> None:
    body = job(
        [task("a", gpu_required=8), task("b", metrics=[]), task("b")],
        [
            {"task": "b", "on": "nope"},
            {"task": "a", "on": "b", "kind": "condition", "condition": "x > 1"},
        ],
        colour="red",
    )
    err = refusal(body, queue="alg", queue_max_gpus=4)
    assert err.code is Code.INVALID_VALUE
    for needle in (
        "colour: unknown field",
        "key 'b' is used twice",
        "unknown task key 'nope'",
        "task 'b' declares no metrics",
        "over queue 'alg' quota max_gpus 4",
    ):
        assert needle in err.message, err.message
    assert "tasks[0].gpu_required" in err.fields


def test_unknown_fields_alone_are_40001() -> None:
    assert refusal(job(CHAIN, [], colour="red")).code is Code.UNKNOWN_FIELD


def test_valid_job_parses() -> None:
    spec = parse_job(
        job(
            [task("prep", volumes=VOL), task("train", metrics=["accuracy"]), task("eval")],
            [
                {"task": "train", "on": "prep", "kind": "data", "artifact": "/work/set"},
                {"task": "eval", "on": "train", "kind": "condition", "condition": "accuracy > .9"},
            ],
        ),
        tenant=True,
        volume_allow_list=ALLOW,
        queue="q",
    )
    assert [n.key for n in spec.tasks] == ["prep", "train", "eval"] and spec.queue == "q"


@pytest.mark.parametrize(
    ("edges", "cycle"),
    [
        ([("a", "b"), ("b", "c")], None),
        ([("a", "b"), ("b", "a")], ["a", "b", "a"]),
        ([("a", "b"), ("b", "c"), ("c", "b")], ["b", "c", "b"]),
        ([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], None),
    ],
    ids=["chain", "two-cycle", "cycle-off-the-root", "diamond"],
)
def test_find_cycle(edges: list[tuple[str, str]], cycle: list[str] | None) -> None:
    assert find_cycle(["a", "b", "c", "d"], edges) == cycle


# --- the condition language -------------------------------------------------------------

TRUE_FALSE = [
    ("accuracy > 0.95", {"accuracy": 0.97}, True),
    ("accuracy > 0.95", {"accuracy": 0.80}, False),
    ("accuracy >= 0.9 and loss < 0.2", {"accuracy": 0.9, "loss": 0.1}, True),
    ("accuracy >= 0.9 and loss < 0.2", {"accuracy": 0.9, "loss": 0.3}, False),
    ("accuracy > 0.99 or loss <= 0.1", {"accuracy": 0.5, "loss": 0.1}, True),
    ("not accuracy > 0.95", {"accuracy": 0.80}, True),
    ("0.9 <= accuracy < 0.99", {"accuracy": 0.95}, True),
    ("0.9 <= accuracy < 0.99", {"accuracy": 0.995}, False),
    ("delta > -1 and epochs == 3", {"delta": -0.5, "epochs": 3}, True),
    ("f1 != 1", {"f1": 1.0}, False),
]


@pytest.mark.parametrize(
    ("text", "metrics", "expected"), TRUE_FALSE, ids=[c[0] for c in TRUE_FALSE]
)
def test_condition_evaluates(text: str, metrics: dict[str, float], expected: bool) -> None:
    assert evaluate(parse_condition(text), metrics) is expected


REFUSED = [
    ("__import__('os').system('x')", "Call"),
    ("accuracy.real > 1", "Attribute"),
    ("metrics['a'] > 1", "Subscript"),
    ("accuracy + 1 > 2", "BinOp"),
    ("accuracy", "Name is not allowed here"),
    ("accuracy > 'x'", "Constant is not allowed"),
    ("accuracy > True", "Constant is not allowed"),
    ("accuracy in (1, 2)", "operator In"),
    ("accuracy is 1", "operator Is"),
    ("lambda: 1", "Lambda"),
    ("(a := 1) > 0", "NamedExpr"),
    ("accuracy > ", "not a valid expression"),
    ("", "non-empty"),
    ("x > 1e999", "Constant is not allowed"),
]


@pytest.mark.parametrize(("text", "needle"), REFUSED, ids=[c[0] or "empty" for c in REFUSED])
def test_condition_refuses_everything_but_comparisons(text: str, needle: str) -> None:
    with pytest.raises(ConditionError, match=None) as err:
        parse_condition(text)
    assert needle in str(err.value)


def test_a_missing_metric_is_named() -> None:
    with pytest.raises(ConditionError, match="not reported: accuracy"):
        evaluate(parse_condition("accuracy > 1"), {"loss": 1.0})


# --- readiness of the four kinds ----------------------------------------------------------


def node(state: NodeState, **kw: Any) -> JobNode:
    return JobNode(key="a", state=state, **kw)


def dep(kind: DependencyKind, **kw: Any) -> Dependency:
    return Dependency(task="b", on="a", kind=kind, **kw)


K = DependencyKind
N = NodeState
ART = "/work/ckpt"
READY = [
    (dep(K.AFTER), node(N.WAITING), "wait"),
    (dep(K.AFTER), node(N.CREATED), "wait"),
    (dep(K.AFTER), node(N.COMPLETED), "ok"),
    (dep(K.AFTER), node(N.FAILED), "never"),
    (dep(K.AFTER), node(N.SKIPPED), "never"),
    (dep(K.DATA, artifact=ART), node(N.CREATED), "wait"),
    (dep(K.DATA, artifact=ART), node(N.FAILED, artifacts=(ART,)), "ok"),
    (dep(K.DATA, artifact=ART), node(N.COMPLETED), "never"),
    (dep(K.DATA, artifact=ART), node(N.FAILED, artifacts=("/work/other",)), "never"),
    (dep(K.RESOURCE), node(N.CREATED), "wait"),
    (dep(K.RESOURCE), node(N.FAILED), "ok"),
    (dep(K.RESOURCE), node(N.STOPPED), "ok"),
    (dep(K.RESOURCE), node(N.SKIPPED), "ok"),
    (dep(K.CONDITION, condition="acc > 0.95"), node(N.CREATED), "wait"),
    (dep(K.CONDITION, condition="acc > 0.95"), node(N.COMPLETED, metrics={"acc": 0.97}), "ok"),
    (dep(K.CONDITION, condition="acc > 0.95"), node(N.COMPLETED, metrics={"acc": 0.8}), "never"),
    (dep(K.CONDITION, condition="acc > 0.95"), node(N.COMPLETED), "never"),
    (dep(K.CONDITION, condition="acc > 0.95"), node(N.FAILED, metrics={"acc": 1}), "never"),
]


@pytest.mark.parametrize(
    ("d", "upstream", "verdict"),
    READY,
    ids=[f"{d.kind.value}-{u.state.value}-{i}" for i, (d, u, _) in enumerate(READY)],
)
def test_readiness(d: Dependency, upstream: JobNode, verdict: str) -> None:
    got, why = readiness(d, upstream)
    assert got == verdict
    assert (why == "") is (verdict == "ok")


# --- the cascade --------------------------------------------------------------------------


def submitted(body: dict[str, Any]) -> Job:
    spec = parse_job(body, tenant=True, volume_allow_list=ALLOW)
    return evolve_job(
        None, JobSubmitted(job_id="job-1", tenant_id=TenantId("t"), spec=spec), NOW, 1
    )


def step(j: Job) -> tuple[Job, list[str]]:
    events, ready = advance(j)
    for ev in events:
        j = evolve_job(j, ev, NOW, j.version + 1)
    return j, ready


def settle(j: Job, key: str, outcome: NodeState, output: str = "") -> tuple[Job, list[str]]:
    metrics, artifacts = parse_report(output)
    ev = JobNodeSettled(
        job_id=j.id,
        key=key,
        task_id=f"t-{key}",
        outcome=outcome,
        metrics=metrics,
        artifacts=artifacts,
    )
    return step(evolve_job(j, ev, NOW, j.version + 1))


BRANCHES = job(
    [task("train", metrics=["accuracy"]), task("export"), task("tune")],
    [
        {"task": "export", "on": "train", "kind": "condition", "condition": "accuracy > 0.95"},
        {"task": "tune", "on": "train", "kind": "condition", "condition": "accuracy <= 0.95"},
    ],
)


def test_chain_runs_in_order_and_succeeds() -> None:
    j, ready = step(submitted(job(CHAIN, [{"task": "b", "on": "a"}, {"task": "c", "on": "b"}])))
    assert ready == ["a"] and j.status is JobStatus.PENDING  # a waits for placement
    assert j.nodes["c"].reason == "waiting for 'b' to complete"
    j, ready = settle(j, "a", N.COMPLETED)
    assert ready == ["b"]
    j, ready = settle(j, "b", N.COMPLETED)
    j, ready = settle(j, "c", N.COMPLETED)
    assert ready == [] and j.status is JobStatus.SUCCEEDED


@pytest.mark.parametrize(
    ("accuracy", "runs", "skipped"), [(0.97, "export", "tune"), (0.80, "tune", "export")]
)
def test_condition_picks_one_branch(accuracy: float, runs: str, skipped: str) -> None:
    j, _ = step(submitted(BRANCHES))
    j, ready = settle(j, "train", N.COMPLETED, f'log\nHF_METRICS {{"accuracy": {accuracy}}}')
    assert ready == [runs]
    assert j.nodes[skipped].state is N.SKIPPED and "is false" in j.nodes[skipped].reason
    j, _ = settle(j, runs, N.COMPLETED)
    assert j.status is JobStatus.SUCCEEDED


def test_data_dependency_runs_after_a_failure_with_the_artifact() -> None:
    body = job(
        [task("a", volumes=VOL), task("b")],
        [{"task": "b", "on": "a", "kind": "data", "artifact": "/work/ckpt"}],
    )
    j, _ = step(submitted(body))
    j, ready = settle(j, "a", N.FAILED, "HF_ARTIFACT /work/ckpt\nboom")
    assert ready == ["b"]
    j, _ = settle(j, "b", N.COMPLETED)
    assert j.status is JobStatus.SUCCEEDED  # a's failure was consumed by its data dependant


def test_a_hard_failure_skips_dependants_and_fails_the_job() -> None:
    j, _ = step(submitted(job(CHAIN, [{"task": "b", "on": "a"}, {"task": "c", "on": "b"}])))
    j, ready = settle(j, "a", N.FAILED)
    assert ready == [] and j.nodes["b"].state is N.SKIPPED and j.nodes["c"].state is N.SKIPPED
    assert j.status is JobStatus.FAILED and "a" in j.reason


def test_resource_dependency_waits_for_any_end() -> None:
    j, _ = step(
        submitted(job([task("a"), task("b")], [{"task": "b", "on": "a", "kind": "resource"}]))
    )
    j, ready = settle(j, "a", N.FAILED)
    assert ready == ["b"]


def test_stop_skips_what_waits() -> None:
    j, _ = step(submitted(job(CHAIN, [{"task": "b", "on": "a"}, {"task": "c", "on": "b"}])))
    j = evolve_job(j, JobStopRequested(job_id=j.id), NOW, j.version + 1)
    j, ready = step(j)
    assert ready == [] and j.nodes["b"].state is N.SKIPPED and j.nodes["c"].state is N.SKIPPED
    assert j.status is JobStatus.PENDING  # a, created, still waits for placement
    j, _ = settle(j, "a", N.STOPPED)
    assert j.status is JobStatus.STOPPED


@pytest.mark.parametrize(
    ("output", "metrics", "artifacts"),
    [
        ('HF_METRICS {"accuracy": 0.9, "name": "x", "ok": true}', {"accuracy": 0.9}, ()),
        ("HF_METRICS not json\nHF_ARTIFACT relative", {}, ()),
        ('HF_METRICS {"a": 1}\nHF_METRICS {"a": 2}\nHF_ARTIFACT /o/x', {"a": 2.0}, ("/o/x",)),
    ],
    ids=["numbers-only", "malformed-ignored", "last-wins"],
)
def test_parse_report(output: str, metrics: dict[str, float], artifacts: tuple[str, ...]) -> None:
    assert parse_report(output) == (metrics, artifacts)


def _status(to: str) -> TaskStatusChanged:
    return TaskStatusChanged(
        task_id=TaskId("t"),
        from_status=TaskStatus.RUNNING,
        to_status=TaskStatus(to),
        actor="agent",
        reason_code=ReasonCode.EXITED,
    )


@pytest.mark.parametrize(
    ("to", "outcome"),
    [
        ("completed", N.COMPLETED),
        ("cancelled", N.STOPPED),
        ("stopped", N.STOPPED),
        ("failed", None),  # final only once the retry engine gives up
        ("running", None),
    ],
    ids=["completed", "cancelled", "stopped", "failed-not-yet", "not-an-end"],
)
def test_a_status_change_that_ends_a_job_task(to: str, outcome: N | None) -> None:
    assert status_outcome(_status(to)) is outcome


@pytest.mark.parametrize(
    ("action", "outcome"),
    [("retry", None), ("give_up", N.FAILED), ("hold", N.FAILED)],
    ids=["retried", "given-up", "held"],
)
def test_a_retry_decision_that_ends_a_job_task(action: str, outcome: N | None) -> None:
    decided = TaskRetryDecided.model_validate(
        {
            "task_id": "t",
            "attempt": 1,
            "node_id": None,
            "failure_class": "other",
            "failure_kind": "exit",
            "action": action,
            "reason": "r",
        }
    )
    assert retry_outcome(decided) is outcome


def test_the_orchestrator_takes_status_changes_and_retry_decisions() -> None:
    """A failed job task is final only with the retry engine's decision: both types count;
    a pending reason is news of a task that waits."""
    orchestrator = Orchestrator(cast(EventStore, None))
    assert orchestrator.handlers.types == {
        TaskCreated.type,
        TaskStatusChanged.type,
        TaskRetryDecided.type,
        TaskPendingReason.type,
    }


async def test_a_tasks_job_is_learned_from_its_creation_without_a_read() -> None:
    """The creation event says which job a task belongs to (or none): its later events are
    decided without reading the row (a read through this store would fail)."""

    class NoReads:
        @property
        def pool(self) -> Any:
            raise AssertionError("the store was read")

    orchestrator = Orchestrator(cast(EventStore, NoReads()))
    for task_id, job_id in (("t-plain", ""), ("t-job", "job-1")):
        created = TaskCreated(
            task_id=TaskId(task_id),
            tenant_id=TenantId("acme"),
            spec=TaskSpec(name="a", command="true", platform=Platform(job_id=job_id)),
        )
        env = envelope(TaskCreated.type, created, stream_id=task_id, version=1)
        await orchestrator.handle(env)
    assert await orchestrator.in_a_job("t-plain") is False
    assert await orchestrator.in_a_job("t-job") is True
    with pytest.raises(AssertionError, match="the store was read"):  # one never seen is
        await orchestrator.in_a_job("t-unseen")  # read as before
