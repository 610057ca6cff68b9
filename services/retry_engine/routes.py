"""The retry engine's subscriber: every task failure, on a durable consumer."""

from __future__ import annotations

from libs.bus.broker import Handle, Routes
from libs.bus.subjects import EVENTS_PREFIX, EVENTS_STREAM
from libs.domain.envelope import EventEnvelope

CONSUMER = "retry-engine"


def routes(failures: Handle[EventEnvelope]) -> Routes:
    """The retry engine's subscriber (handlers as arguments: see heteroflow/asyncapi.py)."""
    r = Routes("retry-engine")
    r.durable(
        EventEnvelope,
        failures,
        stream=EVENTS_STREAM,
        durable=CONSUMER,
        subject=f"{EVENTS_PREFIX}.task.{{task_id}}.task_status_changed",
        description="Decides retry or give-up for each task that failed.",
    )
    return r
