"""The pool and queue folds."""

from __future__ import annotations

from datetime import datetime

from libs.domain.payload import Payload
from libs.domain.pool.events import (
    PoolCreated,
    PoolDeleted,
    PoolUpdated,
    QueueCreated,
    QueueDeleted,
    QueueUpdated,
)
from libs.domain.pool.model import Pool, Queue, pool_stream, queue_stream


def evolve_pool(pool: Pool | None, event: Payload, at: datetime, version: int) -> Pool:
    if isinstance(event, PoolCreated):
        return Pool(
            id=pool_stream(event.spec.name),
            spec=event.spec,
            version=version,
            created_at=at,
            updated_at=at,
        )
    if pool is None:
        raise ValueError(f"{event.type} before pool_created")
    if isinstance(event, PoolUpdated):
        return pool.model_copy(update={"spec": event.spec, "version": version, "updated_at": at})
    if isinstance(event, PoolDeleted):
        return pool.model_copy(update={"deleted_at": at, "version": version, "updated_at": at})
    raise ValueError(f"not a pool event: {event.type}")


def evolve_queue(queue: Queue | None, event: Payload, at: datetime, version: int) -> Queue:
    if isinstance(event, QueueCreated):
        return Queue(
            id=queue_stream(event.spec.name),
            spec=event.spec,
            version=version,
            created_at=at,
            updated_at=at,
        )
    if queue is None:
        raise ValueError(f"{event.type} before queue_created")
    if isinstance(event, QueueUpdated):
        return queue.model_copy(update={"spec": event.spec, "version": version, "updated_at": at})
    if isinstance(event, QueueDeleted):
        return queue.model_copy(update={"deleted_at": at, "version": version, "updated_at": at})
    raise ValueError(f"not a queue event: {event.type}")
