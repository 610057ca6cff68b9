"""Turn committed task transitions into node commands (the outbox pattern, one hop on).

The scheduler commits `pending → scheduled`; the relay publishes that event; this consumer
sends `start` to the node. A crash between any two steps loses nothing: the event is
redelivered until acknowledged, and the command's message id makes a resend a no-op.

Events come in fetched batches (`handle_batch`): each is read as its model
(`TaskStatusChanged`), the tasks of a batch are read together (those the placer of this
process committed by version only: `EventStore.tasks_by_ids`), and the commands
published pipelined (all in flight, acks awaited together). A batch's commands leave in the
order of its events, on one connection, so the commands of one task reach its node's stream
in order. What a command holds is dispatch.py's (`command_for`).
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog
from nats.js import JetStreamContext

from libs.domain.envelope import EventEnvelope
from libs.domain.errors import NotFound
from libs.domain.group.model import current_members, group_env
from libs.domain.protocol import NodeCommand
from libs.domain.task.events import TaskStatusChanged
from libs.domain.task.model import Task
from libs.domain.task.states import TaskStatus
from libs.domain.task.variants import placed_spec
from libs.ownership import own_members
from libs.store import groups as group_rows
from libs.store.eventstore import EventStore

from .. import view
from ..controllers.groups import load_group_tasks
from ..dispatch import KIND_FOR_STATUS, command_for, send, send_all
from ..placement.model import Gpu

log = structlog.get_logger(__name__)

S = TaskStatus


def commanding(envelope: EventEnvelope) -> TaskStatusChanged | None:
    """The transition an event records, when its new status asks for a command (a payload
    that does not parse raises: the batch is redelivered, then dead-lettered)."""
    if envelope.type != TaskStatusChanged.type:
        return None
    ev = TaskStatusChanged.model_validate(envelope.payload)
    return ev if ev.to_status in KIND_FOR_STATUS else None


class Dispatcher:
    def __init__(self, store: EventStore, js: JetStreamContext) -> None:
        self.store = store
        self.js = js

    async def group_run(self, task: Task) -> tuple[dict[str, str], bool]:
        """A member's distributed environment (WORLD_SIZE, MASTER_ADDR: rank 0's node
        address, ...), and whether it runs on its host's network
        (a static-world member: its peers reach MASTER_ADDR:MASTER_PORT, docs/groups.md).
        MASTER_PORT is the port the scheduler allocated with rank 0's placement."""
        group = await group_rows.get(self.store, task.group_id or "", include_deleted=True)
        if group is None or task.rank is None:
            return {}, False
        # Only the group's own tasks: another's claiming rank 0 gives no MASTER_ADDR.
        members = current_members(own_members(group, await load_group_tasks(self.store, group.id)))
        placed = {m.rank: m.node_id for m in members if m.node_id}
        rank0 = next((m for m in members if m.rank == 0 and m.node_id), None)
        wanted = {*placed.values(), task.node_id or ""}
        nodes = {n.id: n for n in await view.load_nodes(self.store, sorted(wanted))}
        master = nodes.get(placed.get(0) or "")
        vendor = ""
        node = nodes.get(task.node_id or "")
        if node and task.gpu_ids:
            vendor = next((g.vendor for g in node.inventory.gpus if g.id == task.gpu_ids[0]), "")
        env = group_env(
            group.spec,
            task.rank,
            master.inventory.address if master else "",
            len(set(placed.values())) or 1,
            vendor,
            rank0.ports.get("master") if rank0 else None,
        )
        return env, group.spec.static_world

    async def handle_batch(self, envelopes: list[EventEnvelope]) -> list[BaseException | None]:
        """Commands for a batch of events: one read of their tasks, one pipelined publish."""
        wanted = [(i, ev) for i, e in enumerate(envelopes) if (ev := commanding(e)) is not None]
        ids = sorted({ev.task_id for _, ev in wanted})
        # A start's task is most often one this process's placer just committed: the store
        # then reads its version only, not the document again.
        tasks = await self.store.tasks_by_ids(ids) if ids else {}
        starts = [t for t in tasks.values() if t.status is S.SCHEDULED]
        gpus = await self.cards_of(starts)
        cmds: list[tuple[int, NodeCommand]] = []
        for i, ev in wanted:
            task = tasks.get(ev.task_id)
            cmd = command_for(task, ev.to_status, gpus) if task is not None else None
            if task is not None and cmd is not None:
                cmds.append((i, await self.with_group_env(task, cmd)))
        outcomes: list[BaseException | None] = [None] * len(envelopes)
        sent = await send_all(self.js, [cmd for _, cmd in cmds])
        for (i, cmd), failed in zip(cmds, sent, strict=True):
            outcomes[i] = failed
            if failed is None:
                log.info(
                    "command_sent", kind=cmd.kind.value, task_id=cmd.task_id, node_id=cmd.node_id
                )
        return outcomes

    async def cards_of(self, tasks: Iterable[Task]) -> dict[str, Gpu]:
        """The cards, by id, of the nodes the fractions among `tasks` are placed on (one read;
        none without a fraction)."""
        ids = sorted({t.node_id for t in tasks if t.node_id and placed_spec(t).is_fractional})
        if not ids:
            return {}
        return {
            g.id: g
            for doc in await view.load_nodes(self.store, ids)
            for g in view.to_node(doc).gpus
        }

    async def with_group_env(self, task: Task, cmd: NodeCommand) -> NodeCommand:
        """A group member's start carries the group's distributed environment."""
        if cmd.run is None or not task.group_id:
            return cmd
        env, host_network = await self.group_run(task)
        run = cmd.run.model_copy(update={"group_env": env, "host_network": host_network})
        return cmd.model_copy(update={"run": run})

    async def handle(self, envelope: EventEnvelope) -> None:
        ev = commanding(envelope)
        if ev is None:
            return
        to = ev.to_status
        try:
            task = await self.store.get_task(ev.task_id, include_deleted=True)
        except NotFound:
            return
        cmd = command_for(task, to, await self.cards_of([task]) if to is S.SCHEDULED else None)
        if cmd is None:
            return
        await send(self.js, await self.with_group_env(task, cmd))
        log.info("command_sent", kind=cmd.kind.value, task_id=cmd.task_id, node_id=cmd.node_id)
