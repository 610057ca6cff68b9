"""Turn committed task transitions into node commands (the outbox pattern, one hop on).

The scheduler commits `pending → scheduled`; the relay publishes that event; this consumer
sends `start` to the node. A crash between any two steps loses nothing: the event is
redelivered until acknowledged, and the command's message id makes a resend a no-op.

Events come in fetched batches (`handle_batch`): the tasks of a batch are read in one query,
and the commands published pipelined (all in flight, acks awaited together). A batch's
commands leave in the order of its events, on one connection, so the commands of one task
reach its node's stream in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence

import structlog
from nats.js import JetStreamContext
from nats.js.api import PubAck

from libs.bus.subjects import node_command_subject
from libs.domain.envelope import EventEnvelope
from libs.domain.errors import NotFound
from libs.domain.group import current_members, group_env
from libs.domain.protocol import CommandKind, GpuShare, NodeCommand, TaskRunSpec
from libs.domain.states import TaskStatus
from libs.domain.task import Task
from libs.ownership import own_members
from libs.store import groups as group_rows
from libs.store import tasks as task_rows
from libs.store.eventstore import EventStore

from . import view
from .controllers.groups import load_group_tasks
from .placement import Allocation, Gpu

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


def run_payload(task: Task, gpus: Mapping[str, Gpu] | None = None) -> TaskRunSpec:
    """The START's run spec. `gpus`: the cards of the task's node by id, from which a
    fraction's share is counted exactly as the ledger counts it (`Allocation.from_task`), so
    the agent holds the task to what the scheduler accounted. A fraction whose card is not in
    `gpus` goes without a share (the agent then reads the spec's figures)."""
    share = None
    if task.spec.is_fractional:
        counted = Allocation.from_task(task, gpus or {}).fractions
        if counted:
            share = GpuShare(
                gpu_id=counted[0].gpu_id,
                memory_mb=counted[0].vram_mb,
                compute_ratio=counted[0].compute_ratio,
            )
        else:
            log.warning("fraction_card_unknown", task_id=task.id, gpu_ids=task.gpu_ids)
    return TaskRunSpec(
        spec=task.spec,
        gpu_ids=task.gpu_ids,
        qos=task.qos,
        tenant_id=task.tenant_id,
        group_id=task.group_id,
        rank=task.rank,
        gpu_label=task.gpu_label,
        serve_port=task.ports.get("serve"),
        gpu_share=share,
    )


def command_for(
    task: Task, to: TaskStatus, gpus: Mapping[str, Gpu] | None = None
) -> NodeCommand | None:
    """The command for a transition to `to`, if the task is still there and placed; `gpus`
    as for `run_payload`."""
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
        run=run_payload(task, gpus) if kind is CommandKind.START else None,
    )


async def send(js: JetStreamContext, cmd: NodeCommand) -> None:
    await js.publish(
        node_command_subject(cmd.node_id),
        cmd.model_dump_json().encode(),
        headers={"Nats-Msg-Id": cmd.msg_id},
    )


PUBLISH_TIMEOUT_S = 5.0


async def send_all(
    js: JetStreamContext, cmds: Sequence[NodeCommand], ack_wait_s: float = PUBLISH_TIMEOUT_S
) -> list[BaseException | None]:
    """Publish `cmds` pipelined, in order; one outcome per command (None: acknowledged)."""
    futures: list[asyncio.Future[PubAck] | BaseException] = []
    for cmd in cmds:
        try:
            futures.append(
                await js.publish_async(
                    node_command_subject(cmd.node_id),
                    cmd.model_dump_json().encode(),
                    wait_stall=ack_wait_s,
                    headers={"Nats-Msg-Id": cmd.msg_id},
                )
            )
        except Exception as exc:  # stalled or closed: this one did not go out
            futures.append(exc)
    pending = [f for f in futures if isinstance(f, asyncio.Future)]
    if pending:
        # nats-py never resolves the future of a publish the server refused: bound the wait.
        await asyncio.wait(pending, timeout=ack_wait_s)
    return [_outcome(f) for f in futures]


def _outcome(f: asyncio.Future[PubAck] | BaseException) -> BaseException | None:
    if isinstance(f, BaseException):
        return f
    if not f.done():
        f.cancel()
        return TimeoutError("no acknowledgement from JetStream")
    return f.exception()


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
        wanted = [(i, _target(e)) for i, e in enumerate(envelopes)]
        ids = sorted({envelopes[i].payload["task_id"] for i, to in wanted if to is not None})
        tasks = {t.id: t for t in await task_rows.by_ids(self.store, ids)} if ids else {}
        starts = [t for t in tasks.values() if t.status is S.SCHEDULED]
        gpus = await self.cards_of(starts)
        cmds: list[tuple[int, NodeCommand]] = []
        for i, to in wanted:
            task = tasks.get(envelopes[i].payload["task_id"])
            cmd = command_for(task, to, gpus) if task is not None and to is not None else None
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
        ids = sorted({t.node_id for t in tasks if t.node_id and t.spec.is_fractional})
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
        cmd = command_for(task, to, await self.cards_of([task]) if to is S.SCHEDULED else None)
        if cmd is None:
            return
        await send(self.js, await self.with_group_env(task, cmd))
        log.info("command_sent", kind=cmd.kind.value, task_id=cmd.task_id, node_id=cmd.node_id)


def _target(envelope: EventEnvelope) -> TaskStatus | None:
    """The status a transition event moves to, when that status asks for a command."""
    if envelope.type != "task_status_changed":
        return None
    to = TaskStatus(envelope.payload["to_status"])
    return to if to in KIND_FOR_STATUS else None
