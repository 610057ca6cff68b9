"""The retry engine's verdict kept on the task (issue 29, item 6): folded from
`task_retry_decided` by the live fold and by replay's document fold alike, server-owned, and
shown by `heteroflow describe`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest

from heteroflow.cli_user.output import describe_text
from libs.domain.errors import DomainError
from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.task.events import TaskCreated, TaskRetryDecided, TaskStatusChanged
from libs.domain.task.evolve import evolve_task
from libs.domain.task.model import Task, TaskId, TaskSpec, TenantId, parse_create
from libs.domain.task.states import TaskStatus
from libs.store.replay_fold import TaskFold

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TID = TaskId("task-1")


def decided(action: str, reason: str, attempt: int = 0) -> TaskRetryDecided:
    return TaskRetryDecided.model_validate(
        {
            "task_id": TID,
            "attempt": attempt,
            "node_id": "n1",
            "failure_class": "permanent" if action == "give_up" else "other",
            "failure_kind": "PermissionDenied" if action == "give_up" else "",
            "action": action,
            "reason": reason,
        }
    )


def status(frm: TaskStatus, to: TaskStatus, **extra: object) -> TaskStatusChanged:
    return TaskStatusChanged.model_validate(
        {
            "task_id": TID,
            "from_status": frm,
            "to_status": to,
            "actor": "agent",
            "reason_code": ReasonCode.EXITED,
        }
        | extra
    )


def history(*tail: Payload) -> list[Payload]:
    created = TaskCreated(
        task_id=TID, tenant_id=TenantId("t"), spec=TaskSpec(name="x", image="busybox")
    )
    S = TaskStatus
    return [
        created,
        status(S.PENDING, S.SCHEDULED, node_id="n1"),
        status(S.SCHEDULED, S.RUNNING),
        status(S.RUNNING, S.FAILED, exit_code=1),
        *tail,
    ]


def fold_live(events: list[Payload]) -> Task:
    task = None
    for i, ev in enumerate(events, start=1):
        task = evolve_task(task, ev, T0 + timedelta(seconds=i), i)
    assert task is not None
    return task


def fold_replay(events: list[Payload]) -> str:
    fold = TaskFold()
    for i, ev in enumerate(events, start=1):
        text = ev.model_dump_json()
        fold.apply(TID, ev.type, text, T0 + timedelta(seconds=i), i)
    return str(TaskFold.row(fold.docs[TID])[-1])


GIVE_UP = "permanent failure (PermissionDenied): output says 'permission denied'; not retried"
CASES = [
    pytest.param([], None, id="never-decided"),
    pytest.param([decided("give_up", GIVE_UP)], "give_up", id="given-up"),
    pytest.param(
        [
            decided("retry", "exit code 3: retry_new_node on any node"),
            status(TaskStatus.FAILED, TaskStatus.PENDING, retry_count=1),
        ],
        "retry",
        id="retried",
    ),
]


@pytest.mark.parametrize(("tail", "verdict"), CASES)
def test_the_verdict_is_folded_from_the_decision(tail: list[Payload], verdict: str | None) -> None:
    events = history(*tail)
    task = fold_live(events)
    if verdict is None:
        assert task.retry is None
    else:
        assert task.retry is not None and task.retry.verdict == verdict
        assert task.retry.reason == tail[0].model_dump()["reason"]
        assert task.retry.decided_at == T0 + timedelta(seconds=5)
    # Replay's document fold writes the same row document as the live projection.
    live = orjson.loads(task.model_dump_json())
    assert orjson.loads(fold_replay(events)) == live


def test_a_permanent_failure_stays_failed_with_its_verdict() -> None:
    task = fold_live(history(decided("give_up", GIVE_UP)))
    assert task.status is TaskStatus.FAILED and task.retry is not None
    assert (task.retry.verdict, task.retry.failure_class) == ("give_up", "permanent")


def test_the_verdict_is_server_owned() -> None:
    with pytest.raises(DomainError) as err:
        parse_create({"name": "x", "image": "busybox", "retry": {"verdict": "retry"}}, tenant=True)
    assert err.value.fields == ["retry"]


def test_describe_shows_the_verdict_and_its_reason() -> None:
    task = orjson.loads(fold_live(history(decided("give_up", GIVE_UP))).model_dump_json())
    line = next(
        x for x in describe_text(task, [], []).splitlines() if x.startswith("Retry verdict:")
    )
    assert "given up (failed for good), permanent: permanent failure (PermissionDenied)" in line
    never = orjson.loads(fold_live(history()).model_dump_json())
    assert "Retry verdict" not in describe_text(never, [], [])
