"""Subject and stream naming for the bus: pure functions and constants, no I/O.

Every subject the platform publishes on is built here, so the catalogue in docs/events.md and
the code cannot drift apart:

* domain events: ``hf.events.<stream_type>.<stream_id>.<event_type>``
* node traffic: ``hf.node.<node_id>.cmd`` | ``.report`` | ``.heartbeat``
* dead letters: ``hf.dlq.<original subject>``

A subject token may not contain ``.``, ``*``, ``>`` or whitespace (NATS would read them as
separators or wildcards). Ids are expected to use only ``[A-Za-z0-9_-]``; anything else is
escaped as ``%XX`` per UTF-8 byte (``%`` itself included), so the mapping is reversible and two
different ids never share a subject.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ROOT = "hf"
EVENTS_PREFIX = f"{ROOT}.events"
NODE_PREFIX = f"{ROOT}.node"
DLQ_PREFIX = f"{ROOT}.dlq"
SERVING_PREFIX = f"{ROOT}.serving"

EVENTS_STREAM = "HF_EVENTS"
NODE_STREAM = "HF_NODE"
DLQ_STREAM = "HF_DLQ"

EVENTS_SUBJECTS: tuple[str, ...] = (f"{EVENTS_PREFIX}.>",)
# Only commands and reports are kept: heartbeats and log requests are core NATS traffic
# (a log request captured by a stream would be answered by the stream's publish ack).
NODE_SUBJECTS: tuple[str, ...] = (f"{NODE_PREFIX}.*.cmd", f"{NODE_PREFIX}.*.report")
DLQ_SUBJECTS: tuple[str, ...] = (f"{DLQ_PREFIX}.>",)

# The window in which JetStream drops a second message with the same Nats-Msg-Id.
DUPLICATE_WINDOW_S = 120.0
DAY_S = 86_400.0
EVENTS_MAX_AGE_S = 30 * DAY_S
NODE_MAX_AGE_S = 1 * DAY_S
DLQ_MAX_AGE_S = 30 * DAY_S

LEASE_BUCKET = "hf_leases"

# Headers the relay sets on every event message.
HDR_MSG_ID = "Nats-Msg-Id"
HDR_EVENT_TYPE = "Hf-Event-Type"
HDR_STREAM_ID = "Hf-Stream-Id"
HDR_VERSION = "Hf-Version"
HDR_POSITION = "Hf-Position"

_SAFE_TOKEN = re.compile(r"[A-Za-z0-9_-]+")


def escape_token(value: str) -> str:
    """`value` as one subject token: safe characters kept, the rest as ``%XX`` bytes."""
    if not value:
        raise ValueError("a subject token must not be empty")
    if _SAFE_TOKEN.fullmatch(value):
        return value
    out: list[str] = []
    for ch in value:
        if _SAFE_TOKEN.fullmatch(ch):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode())
    return "".join(out)


def unescape_token(token: str) -> str:
    """Inverse of `escape_token`."""
    raw = bytearray()
    i = 0
    while i < len(token):
        if token[i] == "%":
            raw.append(int(token[i + 1 : i + 3], 16))
            i += 3
        else:
            raw.extend(token[i].encode())
            i += 1
    return raw.decode()


def event_subject(stream_type: str, stream_id: str, event_type: str) -> str:
    """Subject of one domain event: ``hf.events.<stream_type>.<stream_id>.<event_type>``."""
    parts = (escape_token(stream_type), escape_token(stream_id), escape_token(event_type))
    return ".".join((EVENTS_PREFIX, *parts))


def event_filter(
    stream_type: str | None = None, stream_id: str | None = None, event_type: str | None = None
) -> str:
    """A subscription filter over events; an omitted part matches any value."""
    parts = [escape_token(p) if p is not None else "*" for p in (stream_type, stream_id)]
    parts.append(escape_token(event_type) if event_type is not None else "*")
    return ".".join((EVENTS_PREFIX, *parts))


@dataclass(frozen=True)
class EventSubject:
    stream_type: str
    stream_id: str
    event_type: str


def parse_event_subject(subject: str) -> EventSubject:
    """Split an event subject back into its (unescaped) parts."""
    tokens = subject.split(".")
    if len(tokens) != 5 or ".".join(tokens[:2]) != EVENTS_PREFIX:
        raise ValueError(f"not an event subject: {subject!r}")
    return EventSubject(*(unescape_token(t) for t in tokens[2:]))


def node_command_subject(node_id: str) -> str:
    """Commands for one node agent (placement, stop, ...)."""
    return f"{NODE_PREFIX}.{escape_token(node_id)}.cmd"


def node_report_subject(node_id: str) -> str:
    """State changes reported by one node agent."""
    return f"{NODE_PREFIX}.{escape_token(node_id)}.report"


def node_logs_subject(node_id: str) -> str:
    """Log requests answered by one node agent (core NATS request/reply)."""
    return f"{NODE_PREFIX}.{escape_token(node_id)}.logs"


def node_telemetry_subject(node_id: str) -> str:
    """GPU samples of one node agent (core NATS: a lost sample is a gap, not an error)."""
    return f"{NODE_PREFIX}.{escape_token(node_id)}.telemetry"


def node_heartbeat_subject(node_id: str) -> str:
    """Liveness beats of one node agent."""
    return f"{NODE_PREFIX}.{escape_token(node_id)}.heartbeat"


def serving_metrics_subject(target_id: str) -> str:
    """The router's request figures for one serving target (core NATS)."""
    return f"{SERVING_PREFIX}.{escape_token(target_id)}.metrics"


def node_of_subject(subject: str) -> str | None:
    """The (unescaped) node id of a ``hf.node.<id>.<kind>`` subject, else None."""
    tokens = subject.split(".")
    if len(tokens) != 4 or ".".join(tokens[:2]) != NODE_PREFIX:
        return None
    return unescape_token(tokens[2])


def dlq_subject(original_subject: str) -> str:
    """Where a message that exhausted its deliveries is parked for inspection."""
    return f"{DLQ_PREFIX}.{original_subject}"


def max_deliveries_advisory(stream: str, consumer: str = "*") -> str:
    """JetStream's advisory subject for a message that reached a consumer's max_deliver."""
    return f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{consumer}"
