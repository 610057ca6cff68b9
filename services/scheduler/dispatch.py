"""Node commands for task transitions: which command a status asks for, the START's run
spec, and publishing commands to their node's stream (`send`, pipelined `send_all`).

The consumer that turns committed transitions into commands is handlers/dispatch.py; the
node monitor and the report handler send their stop commands through here too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import structlog
from nats.js import JetStreamContext
from nats.js.api import PubAck

from libs.bus.acks import AckInbox
from libs.bus.subjects import node_command_subject
from libs.domain.protocol import CommandKind, GpuShare, NodeCommand, TaskRunSpec
from libs.domain.task.model import Task
from libs.domain.task.states import TaskStatus
from libs.domain.task.variants import placed_spec

from .placement.model import Allocation, Gpu

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
    # A task with variants runs the one it was placed with (docs/scheduling.md#variants).
    spec = placed_spec(task)
    if spec.is_fractional:
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
        spec=spec,
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
        attempt=task.attempt,
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
    """Publish `cmds` pipelined, in order; one outcome per command (None: acknowledged, else
    the server's refusal, or a timeout when no answer came)."""
    acks = AckInbox.of(js._nc)
    futures: list[asyncio.Future[PubAck] | BaseException] = []
    for cmd in cmds:
        try:
            futures.append(
                await acks.publish(
                    node_command_subject(cmd.node_id),
                    cmd.model_dump_json().encode(),
                    {"Nats-Msg-Id": cmd.msg_id},
                )
            )
        except Exception as exc:  # closed or its buffer full: this one did not go out
            futures.append(exc)
    pending = [f for f in futures if isinstance(f, asyncio.Future)]
    if pending:
        await asyncio.wait(pending, timeout=ack_wait_s)
    return [_outcome(f) for f in futures]


def _outcome(f: asyncio.Future[PubAck] | BaseException) -> BaseException | None:
    if isinstance(f, BaseException):
        return f
    if not f.done():
        f.cancel()
        return TimeoutError("no acknowledgement from JetStream")
    return f.exception()
