"""Turn committed task transitions into node commands (the outbox pattern, one hop on).

The scheduler commits `pending → scheduled`; the relay publishes that event; this consumer
sends `start` to the node. A crash between any two steps loses nothing: the event is
redelivered until acknowledged, and the command's message id makes a resend a no-op.
"""

from __future__ import annotations

import structlog
from nats.js import JetStreamContext

from libs.bus.subjects import node_command_subject
from libs.domain.envelope import EventEnvelope
from libs.domain.errors import NotFound
from libs.domain.group import current_members, group_env
from libs.domain.protocol import CommandKind, NodeCommand, TaskRunSpec
from libs.domain.states import TaskStatus
from libs.domain.task import Task
from libs.store import groups as group_rows
from libs.store.eventstore import EventStore

from . import view
from .groups import load_group_tasks

log = structlog.get_logger(__name__)

S = TaskStatus
KIND_FOR_STATUS: dict[TaskStatus, CommandKind] = {
    S.SCHEDULED: CommandKind.START,
    S.STOPPING: CommandKind.STOP,
    S.PREEMPTING: CommandKind.STOP,
    S.DRAINING: CommandKind.STOP,
    S.SLEEPING: CommandKind.PAUSE,
    S.WAKING: CommandKind.RESUME,
}
STOP_GRACE_S = 10.0


def run_payload(task: Task) -> TaskRunSpec:
    return TaskRunSpec(
        spec=task.spec,
        gpu_ids=task.gpu_ids,
        qos=task.qos,
        tenant_id=task.tenant_id,
        group_id=task.group_id,
        rank=task.rank,
    )


def command_for(task: Task, to: TaskStatus) -> NodeCommand | None:
    """The command for a transition to `to`, if the task is still there and placed."""
    kind = KIND_FOR_STATUS.get(to)
    if kind is None or task.status is not to or not task.node_id:
        return None  # stale: the task moved on; the later event brings its own command
    return NodeCommand(
        kind=kind,
        node_id=task.node_id,
        task_id=task.id,
        attempt=task.retry_count,
        status=to,
        task_version=task.version,
        grace_s=STOP_GRACE_S,
        run=run_payload(task) if kind is CommandKind.START else None,
    )


async def send(js: JetStreamContext, cmd: NodeCommand) -> None:
    await js.publish(
        node_command_subject(cmd.node_id),
        cmd.model_dump_json().encode(),
        headers={"Nats-Msg-Id": cmd.msg_id},
    )


class Dispatcher:
    def __init__(self, store: EventStore, js: JetStreamContext) -> None:
        self.store = store
        self.js = js

    async def group_env(self, task: Task) -> dict[str, str]:
        """WORLD_SIZE, MASTER_ADDR (rank 0's node address), ... for a group member."""
        group = await group_rows.get(self.store, task.group_id or "", include_deleted=True)
        if group is None or task.rank is None:
            return {}
        members = current_members(await load_group_tasks(self.store, group.id))
        placed = {m.rank: m.node_id for m in members if m.node_id}
        wanted = {*placed.values(), task.node_id or ""}
        nodes = {n.id: n for n in await view.load_nodes(self.store, sorted(wanted))}
        master = nodes.get(placed.get(0) or "")
        vendor = ""
        node = nodes.get(task.node_id or "")
        if node and task.gpu_ids:
            vendor = next((g.vendor for g in node.inventory.gpus if g.id == task.gpu_ids[0]), "")
        return group_env(
            group.spec,
            task.rank,
            master.inventory.address if master else "",
            len(set(placed.values())) or 1,
            vendor,
        )

    async def handle(self, envelope: EventEnvelope) -> None:
        if envelope.type != "task_status_changed":
            return
        payload = envelope.payload
        to = TaskStatus(payload["to_status"])
        if to not in KIND_FOR_STATUS:
            return
        try:
            task = await self.store.get_task(payload["task_id"], include_deleted=True)
        except NotFound:
            return
        cmd = command_for(task, to)
        if cmd is None:
            return
        if cmd.run is not None and task.group_id:
            env = await self.group_env(task)
            cmd = cmd.model_copy(update={"run": cmd.run.model_copy(update={"group_env": env})})
        await send(self.js, cmd)
        log.info("command_sent", kind=cmd.kind.value, task_id=cmd.task_id, node_id=cmd.node_id)
