"""The console's task page shows the retry engine's verdict on a failed task (issue 29,
item 6), from the task as the store folded it."""

from __future__ import annotations

from functools import partial

from libs.domain.reasons import ReasonCode
from libs.domain.task.decide import decide_transition
from libs.domain.task.events import TaskRetryDecided, TaskStatusChanged
from libs.domain.task.model import Task
from libs.domain.task.states import Actor, TaskStatus

from .helpers import Api
from .test_console import signed_in

GIVE_UP = "permanent failure (PermissionDenied): output says 'permission denied'; not retried"


def move(t: Task, *, to: TaskStatus, actor: Actor) -> list[TaskStatusChanged]:
    return decide_transition(t, to, actor=actor, reason_code=ReasonCode.REPORTED)


async def test_a_given_up_task_shows_its_verdict_and_reason(api: Api) -> None:
    await signed_in(api, api.tenant)
    r = await api.client.post(
        "/api/v1/tasks", json={"name": "denied", "image": "busybox"}, headers=api.tenant
    )
    task_id = r.json()["id"]
    page = await api.client.get(f"/ui/tasks/{task_id}")
    assert page.status_code == 200 and "Retry verdict" not in page.text

    for to, actor in (
        (TaskStatus.SCHEDULED, Actor.SCHEDULER),
        (TaskStatus.RUNNING, Actor.AGENT),
        (TaskStatus.FAILED, Actor.AGENT),
    ):
        await api.store.execute(task_id, partial(move, to=to, actor=actor))

    def give_up(t: Task) -> list[TaskRetryDecided]:
        return [
            TaskRetryDecided(
                task_id=t.id,
                attempt=t.retry_count,
                node_id=None,
                failure_class="permanent",
                failure_kind="PermissionDenied",
                action="give_up",
                reason=GIVE_UP,
            )
        ]

    await api.store.execute(task_id, give_up)
    page = await api.client.get(f"/ui/tasks/{task_id}")
    assert page.status_code == 200
    assert "given up: failed for good" in page.text and "(permanent)" in page.text
    assert "output says &#39;permission denied&#39;; not retried" in page.text, page.text
