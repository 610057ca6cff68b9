"""Stop and delete of a task whose node is offline end it at once (`stopped`): no agent is
there to report, and nothing else would; a wake of a task whose node is offline sends it
back to `pending`. Each reads the node in the transaction of its write (real PostgreSQL, no
agent, no node monitor)."""

from __future__ import annotations

import pytest

from libs.domain.errors import DomainError, NotFound
from libs.domain.group.serving_control import decide_wake
from libs.domain.node.events import NodeOffline, NodeRegistered
from libs.domain.node.model import NodeInventory
from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.task.model import Task
from libs.domain.task.states import Actor, TaskStatus
from libs.store import tasks as task_rows
from libs.store.projections import NODES

from .helpers import AGENT_NODE, Api

pytestmark = pytest.mark.integration


async def sleeping_task(api: Api, node_id: str = AGENT_NODE) -> str:
    r = await api.client.post(
        "/api/v1/tasks", json={"name": "t", "image": "busybox"}, headers=api.tenant
    )
    task_id = str(r.json()["id"])
    await api.place(task_id, node_id)
    r = await api.client.put(
        f"/api/v1/tasks/{task_id}", json={"status": "running"}, headers=api.operator
    )
    assert r.status_code == 200, r.text
    r = await api.client.post(f"/api/v1/tasks/{task_id}/sleep", headers=api.tenant)
    assert r.json()["status"] == "sleeping", r.text
    return task_id


async def node_goes(api: Api, *events: Payload) -> None:
    await api.store.execute_aggregate(NODES, AGENT_NODE, lambda _n: list(events))


async def test_stop_and_delete_on_an_offline_node_end_at_once(api: Api) -> None:
    inv = NodeInventory(memory_mb=8192, cpu_cores=4)
    await node_goes(api, NodeRegistered(node_id=AGENT_NODE, inventory=inv))
    online = await sleeping_task(api)
    r = await api.client.post(f"/api/v1/tasks/{online}/stop", headers=api.tenant)
    assert r.json()["status"] == "stopping", "an online node's agent reports the stop"

    await node_goes(
        api,
        NodeOffline(node_id=AGENT_NODE, silent_seconds=30, reason_code=ReasonCode.NODE_LOST),
    )
    stopped, deleted = await sleeping_task(api), await sleeping_task(api)
    r = await api.client.post(f"/api/v1/tasks/{stopped}/stop", headers=api.tenant)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "stopped" and body["status_reason_code"] == "node_lost"
    assert AGENT_NODE in body["error"]
    r = await api.client.delete(f"/api/v1/tasks/{deleted}", headers=api.tenant)
    assert r.status_code == 200 and r.json()["status"] == "stopped", r.text
    stats = (await api.client.get("/api/v1/tasks/stats", headers=api.tenant)).json()
    assert stats["by_status"]["stopping"] == 1 and stats["by_status"]["sleeping"] == 0


async def test_a_wake_reads_the_host_in_its_own_transaction(api: Api) -> None:
    """A wake on an online host goes `waking`; once the host is offline, the same wake sends
    the task back to `pending`, its placement cleared (SPEC §2's 202 `rescheduling`)."""
    inv = NodeInventory(memory_mb=8192, cpu_cores=4)
    await node_goes(api, NodeRegistered(node_id=AGENT_NODE, inventory=inv))
    woken = await sleeping_task(api)
    r = await api.client.post(f"/api/v1/tasks/{woken}/wake", headers=api.tenant)
    assert (await api.store.get_task(woken)).status is TaskStatus.WAKING, r.text

    await node_goes(
        api,
        NodeOffline(node_id=AGENT_NODE, silent_seconds=30, reason_code=ReasonCode.NODE_LOST),
    )
    moved = await sleeping_task(api)
    r = await api.client.post(f"/api/v1/tasks/{moved}/wake", headers=api.tenant)
    assert r.status_code == 202 and r.json()["status"] == "rescheduling", r.text
    task = await api.store.get_task(moved)
    assert task.status is TaskStatus.PENDING and task.node_id is None
    assert task.status_reason_code is ReasonCode.HOST_OFFLINE_ON_WAKE


async def test_the_routers_batch_wake_decides_each_replica_on_its_own_host(api: Api) -> None:
    inv = NodeInventory(memory_mb=8192, cpu_cores=4)
    await node_goes(api, NodeRegistered(node_id=AGENT_NODE, inventory=inv))
    await api.store.execute_aggregate(
        NODES, "n2", lambda _n: [NodeRegistered(node_id="n2", inventory=inv)]
    )
    lost, kept = await sleeping_task(api), await sleeping_task(api, "n2")
    await node_goes(
        api,
        NodeOffline(node_id=AGENT_NODE, silent_seconds=30, reason_code=ReasonCode.NODE_LOST),
    )

    def wake(t: Task, online: bool) -> list[Payload]:
        return decide_wake(t, online, Actor.CONTROLLER, ReasonCode.REQUEST_WAKE)

    done, refused = await task_rows.execute_batch_by_host(
        api.store, {lost: wake, kept: wake, "task-missing": wake}
    )
    assert set(done) == {lost, kept} and set(refused) == {"task-missing"}
    assert done[lost].status is TaskStatus.PENDING and done[lost].node_id is None
    assert done[kept].status is TaskStatus.WAKING and done[kept].node_id == "n2"


async def test_a_refused_command_writes_nothing_of_the_transaction(api: Api) -> None:
    """The commands of one `execute_by_host` are one transaction: when one is refused, what
    the others decided is rolled back too."""
    inv = NodeInventory(memory_mb=8192, cpu_cores=4)
    await node_goes(api, NodeRegistered(node_id=AGENT_NODE, inventory=inv))
    tid = await sleeping_task(api)
    version = (await api.store.get_task(tid)).version

    def wake(t: Task, online: bool) -> list[Payload]:
        return decide_wake(t, online, Actor.TENANT, ReasonCode.USER_WAKE)

    with pytest.raises(DomainError, match="not sleeping"):
        await task_rows.execute_by_host(api.store, tid, wake, wake)  # the second: waking
    assert (await api.store.get_task(tid)).version == version
    with pytest.raises(NotFound):
        await task_rows.execute_by_host(api.store, tid, wake, tenant_id="globex")
    assert (await api.store.get_task(tid)).status is TaskStatus.SLEEPING
