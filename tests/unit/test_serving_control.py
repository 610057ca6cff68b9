"""The host- and idleness-dependent decisions of libs/domain/group/serving_control.py, table-driven:
a wake on an online or offline host, the end of a stop on a lost host, idle sleep."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from libs.domain.errors import Conflict, DomainError
from libs.domain.group.serving_control import (
    Idleness,
    decide_idle_sleep,
    decide_stop_on_lost_host,
    decide_wake,
    serving_replicas,
    sleep_idle,
)
from libs.domain.reasons import ReasonCode
from libs.domain.task.events import TaskStatusChanged
from libs.domain.task.evolve import evolve_task
from libs.domain.task.lending import TaskWakeQueued
from libs.domain.task.model import Task, TaskId, TaskSpec, TenantId
from libs.domain.task.states import Actor, TaskStatus

NOW = datetime(2026, 1, 1, tzinfo=UTC)
S = TaskStatus
OFFLINE = ReasonCode.HOST_OFFLINE_ON_WAKE


def task(status: TaskStatus = S.SLEEPING, **kw: Any) -> Task:
    base: dict[str, Any] = {
        "id": TaskId("t1"),
        "tenant_id": TenantId("acme"),
        "spec": TaskSpec(name="t", gpu_required=1),
        "status": status,
        "node_id": "n1",
        "gpu_ids": ("n1-gpu0",),
        "created_at": NOW,
        "updated_at": NOW,
    }
    return Task(**(base | kw))


def after(t: Task, events: list[Any]) -> Task:
    for i, e in enumerate(events):
        t = evolve_task(t, e, NOW, t.version + i + 1)
    return t


# --- wake --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "online", "status", "code", "placed"),
    [
        ({}, True, S.WAKING, ReasonCode.USER_WAKE, True),
        ({}, False, S.PENDING, OFFLINE, False),
        ({"node_id": None, "gpu_ids": ()}, False, S.PENDING, OFFLINE, False),
        ({"lent_to": "borrower"}, False, S.PENDING, OFFLINE, False),
    ],
    ids=["online-wakes-in-place", "offline-rescheduled", "no-node-rescheduled",
         "lent-but-offline-rescheduled"],
)  # fmt: skip
def test_wake_by_host(
    changes: dict[str, Any], online: bool, status: TaskStatus, code: ReasonCode, placed: bool
) -> None:
    events = decide_wake(task(**changes), online, Actor.TENANT, ReasonCode.USER_WAKE, "wake")
    (ev,) = events
    assert isinstance(ev, TaskStatusChanged)
    woken = after(task(**changes), events)
    assert (woken.status, woken.status_reason_code) == (status, code)
    assert bool(woken.node_id) is placed


def test_a_lent_card_on_an_online_host_queues_the_wake() -> None:
    (ev,) = decide_wake(task(lent_to="b"), True, Actor.CONTROLLER, ReasonCode.REQUEST_WAKE)
    assert isinstance(ev, TaskWakeQueued) and ev.borrower_task_id == "b"


@pytest.mark.parametrize("online", [True, False], ids=["online", "offline"])
@pytest.mark.parametrize("status", [S.RUNNING, S.PENDING, S.STOPPED], ids=lambda s: s.value)
def test_only_a_sleeping_task_wakes(status: TaskStatus, online: bool) -> None:
    with pytest.raises(DomainError) as err:
        decide_wake(task(status), online, Actor.TENANT, ReasonCode.USER_WAKE)
    assert "not sleeping" in err.value.message


# --- stop on a lost host -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "node", "online", "ends"),
    [
        (S.STOPPING, "n1", False, True),
        (S.STOPPING, "n1", True, False),
        (S.STOPPING, None, False, False),
        (S.RUNNING, "n1", False, False),
        (S.STOPPED, "n1", False, False),
    ],
    ids=["stopping-offline-ends", "stopping-online-waits-for-agent", "never-placed",
         "not-stopping", "already-ended"],
)  # fmt: skip
def test_stop_on_lost_host(status: TaskStatus, node: str | None, online: bool, ends: bool) -> None:
    t = task(status, node_id=node)
    events = decide_stop_on_lost_host(t, online)
    assert bool(events) is ends
    if ends:
        stopped = after(t, events)
        assert stopped.status is S.STOPPED and stopped.status_reason_code is ReasonCode.NODE_LOST
        assert "n1" in stopped.error


# --- idle sleep --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("view", "sleeps"),
    [
        (Idleness(120, activity_s=130, running_s=500), True),
        (Idleness(120, activity_s=100, running_s=500), False),
        (Idleness(120, activity_s=500, running_s=100), False),  # woken 100 s ago
        (Idleness(120, activity_s=None, running_s=130), True),  # no router reports it
        (Idleness(120, activity_s=None, running_s=None), False),  # nothing runs
        (Idleness(120, busy=True, activity_s=500, running_s=500), False),
        (Idleness(0, activity_s=500, running_s=500), False),  # no idle timeout
        (Idleness(120, activity_s=120, running_s=120), True),  # exactly the timeout
    ],
    ids=["idle-past-timeout", "recent-request", "recently-running", "no-figures-since-running",
         "nothing-running", "request-held", "no-timeout", "at-timeout"],
)  # fmt: skip
def test_idle_sleep(view: Idleness, sleeps: bool) -> None:
    assert decide_idle_sleep(view) is sleeps


def test_idle_sleep_is_a_cas_on_running() -> None:
    slept = after(task(S.RUNNING), sleep_idle(task(S.RUNNING)))
    assert slept.status is S.SLEEPING and slept.status_reason_code is ReasonCode.IDLE_SLEEP
    with pytest.raises(Conflict):
        sleep_idle(task(S.WAKING))


def test_serving_replicas_keep_an_old_generation_replica_beside_its_replacement() -> None:
    old = task(S.RUNNING, id=TaskId("old"), group_id="grp-1", rank=0, generation=0)
    new = task(S.RUNNING, id=TaskId("new"), group_id="grp-1", rank=0, generation=1)
    gone = task(S.CANCELLED, id=TaskId("gone"), group_id="grp-1", rank=0, generation=0)
    assert {t.id for t in serving_replicas([old, new, gone])} == {"old", "new"}
