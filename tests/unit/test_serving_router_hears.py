"""The router stops routing to a replica as soon as it hears the replica leave `running`.

Idle sleep is the autoscaler's controller now, not the router's own decision: between the
sleep and the router's next read of the target (a probe interval), a request would reach an
engine just put to sleep. The router hears task status changes on the bus and drops such a
replica at once (services/api_gateway/serving.py `on_status_changed`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from nats.aio.msg import Msg

from libs.config import GatewaySettings
from libs.domain.group.serving import Replica, RequestWindow
from services.api_gateway.serving import ServingRouter, Target
from tests.envelopes import envelope


def status_message(task_id: str, before: str, after: str) -> Msg:
    payload = {
        "task_id": task_id,
        "from_status": before,
        "to_status": after,
        "actor": "controller",
        "reason_code": "idle_sleep",
    }
    event = envelope("task_status_changed", payload, stream_id=task_id, version=3)
    subject = f"hf.events.task.{task_id}.task_status_changed"
    return Msg(_client=None, subject=subject, data=event.body())  # type: ignore[arg-type]


class NoStore:
    """Reads of the target after the event fail: the drop must not wait for them."""

    async def get_task(self, *args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("store away")


def router_with(*replicas: str) -> tuple[ServingRouter, Target]:
    router = ServingRouter(NoStore(), GatewaySettings())  # type: ignore[arg-type]
    t = Target("t-engine", "acme", None, 1, [], RequestWindow(10.0))
    for task_id in replicas:
        t.replicas[task_id] = Replica(task_id, "127.0.0.1:1", ready=True)
    router.targets[t.id] = t
    return router, t


async def test_a_replica_put_to_sleep_is_dropped_at_once() -> None:
    router, t = router_with("t-engine", "t-other")
    await router.on_status_changed(status_message("t-engine", "running", "sleeping"))
    assert set(t.replicas) == {"t-other"}
    await asyncio.sleep(0)  # the re-read it started fails and is only logged
    await router.close()


async def test_a_replica_becoming_running_and_unknown_tasks_change_nothing() -> None:
    router, t = router_with("t-engine")
    await router.on_status_changed(status_message("t-engine", "waking", "running"))
    await router.on_status_changed(status_message("t-stranger", "running", "stopped"))
    assert set(t.replicas) == {"t-engine"}
    await router.close()


async def test_an_unreadable_event_of_a_replica_changes_nothing() -> None:
    router, t = router_with("t-engine")
    bad = Msg(_client=None, subject="hf.events.task.t-engine.task_status_changed", data=b"{")  # type: ignore[arg-type]
    await router.on_status_changed(bad)
    assert set(t.replicas) == {"t-engine"}
    await router.close()
