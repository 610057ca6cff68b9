"""The job orchestrator's subscriber: task events, on a durable consumer."""

from __future__ import annotations

from libs.bus.broker import Handle, Routes
from libs.bus.subjects import EVENTS_PREFIX, EVENTS_STREAM
from libs.domain.envelope import EventEnvelope

CONSUMER = "job-orchestrator"


def routes(task_events: Handle[EventEnvelope]) -> Routes:
    """The orchestrator's subscriber (handlers as arguments: see heteroflow/asyncapi.py)."""
    r = Routes("job-orchestrator")
    r.durable(
        EventEnvelope,
        task_events,
        stream=EVENTS_STREAM,
        durable=CONSUMER,
        subject=f"{EVENTS_PREFIX}.task.{{task_id}}.{{event_type}}",
        description="Task events; a job task's final end settles it and readies its dependants.",
        deliver_new=True,
    )
    return r
