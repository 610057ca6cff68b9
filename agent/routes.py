"""What a node agent consumes and publishes on the bus, as FastStream subscribers.

`node` is the node's subject token (already escaped); the AsyncAPI generator passes
``{node_id}`` so the document shows one channel per kind of subject.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from libs.bus.broker import Handle, Routes
from libs.bus.subjects import NODE_PREFIX, NODE_STREAM
from libs.domain.protocol import (
    Heartbeat,
    LogsReply,
    LogsRequest,
    NodeCommand,
    NodeReport,
)
from libs.domain.telemetry import TelemetryBatch


def routes(
    node: str,
    durable: str,
    *,
    command: Handle[NodeCommand],
    logs: Callable[[LogsRequest], Awaitable[LogsReply]],
    max_in_flight: int = 32,
    inbox_prefix: str | None = None,
) -> Routes:
    r = Routes("agent", inbox_prefix=inbox_prefix)
    r.durable(
        NodeCommand,
        command,
        stream=NODE_STREAM,
        durable=durable,
        subject=f"{NODE_PREFIX}.{node}.cmd",
        description="Commands for this node (start, stop, pause, resume): in order per task, "
        "different tasks' concurrently.",
        batch=max(32, max_in_flight),
        lane=_task_of,
        max_in_flight=max_in_flight,
    )
    r.core(
        LogsRequest,
        logs,
        subject=f"{NODE_PREFIX}.{node}.logs",
        description="Log requests (core NATS request/reply), answered with a LogsReply.",
        replies=True,
    )
    r.publishes(
        LogsReply,
        subject=f"{NODE_PREFIX}.{node}.logs",
        description="The answer to a log request, sent to the requester's inbox.",
        kind="reply",
    )
    r.publishes(
        NodeReport,
        subject=f"{NODE_PREFIX}.{node}.report",
        description=f"Task facts seen by the agent, and its registration (stream {NODE_STREAM}).",
    )
    r.publishes(
        Heartbeat,
        subject=f"{NODE_PREFIX}.{node}.heartbeat",
        description="Liveness beats (core NATS: a lost beat is a missed beat).",
    )
    r.publishes(
        TelemetryBatch,
        subject=f"{NODE_PREFIX}.{node}.telemetry",
        description="GPU samples of the cards running tasks hold (core NATS).",
    )
    return r


def _task_of(cmd: NodeCommand) -> str:
    return cmd.task_id
