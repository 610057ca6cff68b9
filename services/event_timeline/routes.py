"""The timeline's subscribers: every committed event (durable) and GPU telemetry (core)."""

from __future__ import annotations

from libs.bus.broker import Handle, Routes
from libs.bus.subjects import EVENTS_PREFIX, EVENTS_STREAM, NODE_PREFIX, node_of_subject
from libs.domain.envelope import EventEnvelope
from libs.domain.telemetry import TelemetryBatch

CONSUMER = "event-timeline"


def routes(events: Handle[EventEnvelope], telemetry: Handle[TelemetryBatch]) -> Routes:
    """The timeline's subscribers (handlers as arguments: see heteroflow/asyncapi.py)."""
    r = Routes("event-timeline")
    r.durable(
        EventEnvelope,
        events,
        stream=EVENTS_STREAM,
        durable=CONSUMER,
        subject=f"{EVENTS_PREFIX}.{{stream_type}}.{{stream_id}}.{{event_type}}",
        description="Every committed event; the fault-tolerance transitions become entries.",
        deliver_new=True,
    )
    r.core(
        TelemetryBatch,
        telemetry,
        subject=f"{NODE_PREFIX}.{{node_id}}.telemetry",
        queue="telemetry",
        description="GPU samples (core NATS: a lost sample is a gap, not an error); a batch "
        "naming another node than its subject's is dropped.",
        accept=from_its_node,
    )
    return r


def from_its_node(subject: str, batch: TelemetryBatch) -> bool:
    """Samples speak for the node whose subject they came on (agents publish only there)."""
    return node_of_subject(subject) == batch.node_id
