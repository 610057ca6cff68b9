"""The event envelope: one committed event as it travels on the bus and leaves the store.

The outbox relay publishes it, `events republish` publishes it again, `events export` writes it
as JSON lines, and every consumer of ``hf.events.>`` receives it. One model, so the three
cannot disagree; the payload stays a JSON object because its schema depends on `type` (see
`libs.domain.catalog` for the payload models).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field


class EventEnvelope(BaseModel):
    """One committed domain event with its store metadata."""

    model_config = ConfigDict(frozen=True)

    event_id: UUID = Field(description="the event's id; Nats-Msg-Id as well")
    position: int = Field(description="global store position (not commit order)")
    stream_id: str
    stream_type: str = Field(description="task, group, node, ...")
    version: int = Field(description="version within the stream, gap-free")
    type: str = Field(description="event type, e.g. task_status_changed")
    schema_version: int = 1
    occurred_at: datetime
    payload: dict[str, Any] = Field(description="the event's payload model, as JSON")
    metadata: dict[str, Any] = Field(default_factory=dict)

    def body(self) -> bytes:
        """The message body: compact JSON."""
        return self.model_dump_json().encode()

    def as_json(self) -> dict[str, Any]:
        """The envelope as plain JSON values (what `events export` writes)."""
        return self.model_dump(mode="json")
