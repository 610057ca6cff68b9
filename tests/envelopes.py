"""An event as a consumer receives it, for unit tests of handlers: `envelope(type, payload)`
wraps a payload (a model, or its JSON as a dict) in an `EventEnvelope` of a task stream."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from libs.domain.envelope import EventEnvelope
from libs.domain.payload import Payload

AT = datetime(2026, 1, 1, tzinfo=UTC)


def envelope(
    event_type: str,
    payload: Payload | dict[str, Any],
    *,
    stream_id: str = "task-t",
    version: int = 2,
) -> EventEnvelope:
    body = payload.model_dump(mode="json") if isinstance(payload, Payload) else payload
    return EventEnvelope(
        event_id=uuid.uuid4(),
        position=1,
        stream_id=stream_id,
        stream_type="task",
        version=version,
        type=event_type,
        occurred_at=AT,
        payload=body,
    )
