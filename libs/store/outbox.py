"""The outbox relay's messages: one committed event as JetStream carries it (subject,
headers, JSON envelope), its size as the server counts it, which refusals are for good, and the
per-stream version order of a batch. Shared by the relay and `heteroflow events republish`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from nats.errors import MaxPayloadError
from nats.js.errors import APIError
from pydantic import Field

from libs.bus import subjects as s
from libs.domain.envelope import EventEnvelope

from .types import StoredEvent

# JetStream error codes that belong to one message, not to the stream or the server:
# 10054 = message size exceeds the stream's maximum.
PERMANENT_ERR_CODES = frozenset({10054})
# NATS header block framing: "NATS/1.0\r\n" ... "\r\n", and per header "key: value\r\n".
_HEADER_FRAMING = 12
_HEADER_LINE_FRAMING = 4


@dataclass(frozen=True)
class Checkpoint:
    tx_id: int
    position: int


class OutboxEvent(StoredEvent):
    """One row of `events` as the relay reads it: the envelope it publishes, and the id of the
    transaction that wrote it (the checkpoint's half; never part of the message).

    The relay's query has PostgreSQL write the whole message body (`raw`, the envelope as
    JSON): payload and metadata are then neither parsed into Python nor encoded again, and
    stay empty on the row. Without `raw` the body is encoded from the fields."""

    tx_id: str = Field(exclude=True)
    raw: bytes | None = Field(default=None, exclude=True)

    @property
    def checkpoint(self) -> Checkpoint:
        return Checkpoint(int(self.tx_id), self.position)


def outbox_row(**columns: Any) -> OutboxEvent:
    """The relay's row maker (psycopg `kwargs_row`). Not validated: the rows come from our own
    table, one that failed validation would hold the relay for good, and validating costs
    throughput. A `body` column (text) becomes `raw`."""
    body = columns.pop("body", None)
    if body is not None:
        columns.setdefault("payload", {})
        columns.setdefault("metadata", {})
        columns["raw"] = body.encode()
    return cast(OutboxEvent, OutboxEvent.model_construct(**columns))


def subject_of(event: EventEnvelope) -> str:
    return s.event_subject(event.stream_type, event.stream_id, event.type)


def headers_of(event: EventEnvelope) -> dict[str, str]:
    return {
        s.HDR_MSG_ID: str(event.event_id),
        s.HDR_EVENT_TYPE: event.type,
        s.HDR_STREAM_ID: event.stream_id,
        s.HDR_VERSION: str(event.version),
        s.HDR_POSITION: str(event.position),
    }


def envelope_of(event: EventEnvelope) -> bytes:
    """The message body: the event with its store metadata as JSON (as the relay's query
    wrote it, or compact from the fields)."""
    raw = getattr(event, "raw", None)
    return raw if isinstance(raw, bytes) else event.body()


def message_size(
    event: EventEnvelope, expected_stream: str | None = None, body: bytes | None = None
) -> int:
    """Bytes the server counts against its max_payload: headers and body (`body`: the one
    `envelope_of` gives, when the caller has it already) together."""
    headers = headers_of(event)
    if expected_stream is not None:
        headers["Nats-Expected-Stream"] = expected_stream
    header_bytes = _HEADER_FRAMING + sum(
        len(k) + len(v.encode()) + _HEADER_LINE_FRAMING for k, v in headers.items()
    )
    return header_bytes + len(envelope_of(event) if body is None else body)


def is_permanent(exc: BaseException) -> bool:
    """A refusal of this one message that retrying can never change."""
    if isinstance(exc, MaxPayloadError):
        return True
    return isinstance(exc, APIError) and exc.err_code in PERMANENT_ERR_CODES


def in_stream_order(events: Sequence[OutboxEvent]) -> list[OutboxEvent]:
    """`events` with each stream's events put back in version order, in the same slots.

    (tx_id, position) order can invert two versions of one stream: a transaction that took
    its id early (it wrote another stream first) may append version n+1 after a younger
    transaction committed version n. Both are final by the time either is read, so they
    arrive in one batch unless a backlog cuts it between them.
    """
    queues: dict[str, deque[OutboxEvent]] = {}
    for event in sorted(events, key=lambda e: e.version):
        queues.setdefault(event.stream_id, deque()).append(event)
    return [queues[event.stream_id].popleft() for event in events]
