"""Value types of the event store adapter."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from libs.domain.envelope import EventEnvelope

# An event as the store holds it is the envelope itself: what `read_stream` returns is what
# the relay publishes, the bus delivers and `events export` writes, with no conversion between.
StoredEvent = EventEnvelope


@dataclass(frozen=True)
class TaskQuery:
    """Filters, sort and page of GET /tasks (already validated by the gateway)."""

    tenant_id: str | None
    page: int = 1
    per_page: int = 20
    status: str | None = None
    node_id: str | None = None
    name: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    sort: str = "created_at"
    order: str = "desc"
    group_id: str | None = None


@dataclass(frozen=True)
class GroupQuery:
    """Filters, sort and page of GET /task-groups (validated by the gateway like TaskQuery)."""

    tenant_id: str | None
    page: int = 1
    per_page: int = 20
    status: str | None = None
    name: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    sort: str = "created_at"
    order: str = "desc"


@dataclass(frozen=True)
class EventRange:
    """Which events an operator command reads: positions and times inclusive, any of the
    named streams (all when none)."""

    from_position: int | None = None
    from_time: datetime | None = None
    to_position: int | None = None
    streams: tuple[str, ...] = ()

    def clause(self) -> tuple[str, list[Any]]:
        where, params = ["TRUE"], list[Any]()
        if self.from_position is not None:
            where.append("position >= %s")
            params.append(self.from_position)
        if self.from_time is not None:
            where.append("occurred_at >= %s")
            params.append(self.from_time)
        if self.to_position is not None:
            where.append("position <= %s")
            params.append(self.to_position)
        if self.streams:
            where.append("stream_id = ANY(%s)")
            params.append(list(self.streams))
        return " AND ".join(where), params
