"""Pool and queue events."""

from __future__ import annotations

from typing import ClassVar

from libs.domain.payload import Payload, register
from libs.domain.pool.model import PoolSpec, QueueSpec


class PoolCreated(Payload):
    """An operator created (or re-created after a delete) a resource pool."""

    type: ClassVar[str] = "pool_created"
    stream_type: ClassVar[str] = "pool"

    spec: PoolSpec


class PoolUpdated(Payload):
    """The pool's selector or description changed (its name never does)."""

    type: ClassVar[str] = "pool_updated"
    stream_type: ClassVar[str] = "pool"

    spec: PoolSpec


class PoolDeleted(Payload):
    """The pool is gone from queries (refused while a live queue names it)."""

    type: ClassVar[str] = "pool_deleted"
    stream_type: ClassVar[str] = "pool"

    name: str


class QueueCreated(Payload):
    """An operator created (or re-created after a delete) a queue."""

    type: ClassVar[str] = "queue_created"
    stream_type: ClassVar[str] = "queue"

    spec: QueueSpec


class QueueUpdated(Payload):
    """Quota, pools, priority, policy or the default flag changed (name and tenant never)."""

    type: ClassVar[str] = "queue_updated"
    stream_type: ClassVar[str] = "queue"

    spec: QueueSpec


class QueueDeleted(Payload):
    """The queue takes no new work; what it holds runs on."""

    type: ClassVar[str] = "queue_deleted"
    stream_type: ClassVar[str] = "queue"

    name: str


register(PoolCreated, PoolUpdated, PoolDeleted, QueueCreated, QueueUpdated, QueueDeleted)
