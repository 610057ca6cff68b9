"""What the scheduler consumes and publishes on the bus, as FastStream subscribers.

Handlers come in as arguments so that the AsyncAPI document can be generated from these very
declarations without a database (see heteroflow/asyncapi.py).
"""

from __future__ import annotations

from libs.bus.broker import Handle, HandleBatch, Routes
from libs.bus.subjects import (
    EVENTS_PREFIX,
    EVENTS_STREAM,
    NODE_PREFIX,
    NODE_STREAM,
    node_of_subject,
)
from libs.domain.envelope import EventEnvelope
from libs.domain.protocol import Heartbeat, NodeCommand, NodeReport


def routes(
    *,
    dispatch: HandleBatch[EventEnvelope],
    reports: HandleBatch[NodeReport],
    heartbeat: Handle[Heartbeat],
    wake_on_task: Handle[EventEnvelope],
    wake_on_node: Handle[EventEnvelope],
) -> Routes:
    r = Routes("scheduler")
    # Both hot consumers take whole batches: one read and one pipelined publish per batch of
    # transitions, one transaction per batch of reports.
    r.durable_batches(
        EventEnvelope,
        dispatch,
        stream=EVENTS_STREAM,
        durable="scheduler-dispatch",
        subject=f"{EVENTS_PREFIX}.task.{{task_id}}.task_status_changed",
        description="Turns committed task transitions into node commands.",
    )
    r.durable_batches(
        NodeReport,
        reports,
        stream=NODE_STREAM,
        durable="scheduler-reports",
        subject=f"{NODE_PREFIX}.{{node_id}}.report",
        description="Applies agent reports and registrations through the store's CAS; a "
        "report naming another node than its subject's is refused.",
        accept=from_its_node,
        pipelined=True,
    )
    # Core subscriptions (every replica, no ack): beats feed the node monitor while this
    # replica leads it; task and node events wake the placer early.
    r.core(
        Heartbeat,
        heartbeat,
        subject=f"{NODE_PREFIX}.{{node_id}}.heartbeat",
        description="Liveness beats (core NATS, not stored); the node monitor's input; a beat "
        "naming another node than its subject's is dropped.",
        accept=from_its_node,
    )
    r.core(
        EventEnvelope,
        wake_on_task,
        subject=f"{EVENTS_PREFIX}.task.{{task_id}}.{{event_type}}",
        description="Task events that may need or free capacity wake the placer.",
    )
    r.core(
        EventEnvelope,
        wake_on_node,
        subject=f"{EVENTS_PREFIX}.node.{{node_id}}.{{event_type}}",
        description="Node events wake the placer.",
    )
    r.publishes(
        NodeCommand,
        subject=f"{NODE_PREFIX}.{{node_id}}.cmd",
        description=f"Commands for one agent (stream {NODE_STREAM}, one durable per agent).",
    )
    return r


def from_its_node(subject: str, message: NodeReport | Heartbeat) -> bool:
    """A report, registration or heartbeat speaks for the node whose subject it came on,
    and only that one: an agent's NATS user may publish only on its own subjects
    (libs/bus/permissions.py), so this binds what it says to who it is."""
    node_id = message.root.node_id if isinstance(message, NodeReport) else message.node_id
    return node_of_subject(subject) == node_id
