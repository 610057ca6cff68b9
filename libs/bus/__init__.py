"""The message bus: subject naming, NATS connections and declarations, leader leases."""

from __future__ import annotations

from .lease import Lease, open_lease_bucket, run_while_leader
from .nats import (
    connect,
    dead_letter,
    ensure_durable_consumer,
    ensure_stream,
    ensure_streams,
    forward_dead_letters,
    stream_configs,
)
from .subjects import (
    DLQ_STREAM,
    EVENTS_STREAM,
    NODE_STREAM,
    dlq_subject,
    event_filter,
    event_subject,
    node_command_subject,
    node_heartbeat_subject,
    node_report_subject,
    parse_event_subject,
)

__all__ = [
    "DLQ_STREAM",
    "EVENTS_STREAM",
    "NODE_STREAM",
    "Lease",
    "connect",
    "dead_letter",
    "dlq_subject",
    "ensure_durable_consumer",
    "ensure_stream",
    "ensure_streams",
    "event_filter",
    "event_subject",
    "forward_dead_letters",
    "node_command_subject",
    "node_heartbeat_subject",
    "node_report_subject",
    "open_lease_bucket",
    "parse_event_subject",
    "run_while_leader",
    "stream_configs",
]
