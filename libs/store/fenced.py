"""`FencedWriter`: a controller's view of the store, whose every write carries its term's fence.

A leader-only loop (libs/controller.py) gets one per term (`Term.writer`). Its write methods
are the store's, less the `fence` parameter: there is no unfenced variant to call by mistake,
and a write of a deposed term is refused by the store (libs/store/fencing.py). Reads go
through `read`, the store itself; `libs/store` functions that take the store for a read take
it from there. Anything else the term calls (a helper module, a task it starts) writes under
the same fence too: the runtime sets `fencing.TERM_FENCE` for the whole term.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from libs.domain.errors import DomainError
from libs.domain.payload import Payload
from libs.domain.task.model import Task

from .eventstore import Decide, EventStore, NewTask, Step
from .fencing import Fence
from .inbox import Receipt
from .projections import Aggregate, M
from .types import StoredEvent


class FencedWriter:
    """The store's writes under one term's `fence`; `read` for everything else."""

    __slots__ = ("fence", "read")

    def __init__(self, store: EventStore, fence: Fence) -> None:
        self.read = store
        self.fence = fence

    async def execute(
        self,
        task_id: str,
        decide: Decide,
        *,
        tenant_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        include_deleted: bool = False,
        receipt: Receipt | None = None,
    ) -> Task:
        return await self.read.execute(
            task_id,
            decide,
            tenant_id=tenant_id,
            metadata=metadata,
            include_deleted=include_deleted,
            fence=self.fence,
            receipt=receipt,
        )

    async def execute_batch(
        self,
        decisions: dict[str, Decide],
        *,
        metadata: dict[str, Any] | None = None,
        receipt: Receipt | None = None,
        known: dict[str, Task] | None = None,
    ) -> tuple[dict[str, Task], dict[str, DomainError]]:
        return await self.read.execute_batch(
            decisions, metadata=metadata, fence=self.fence, receipt=receipt, known=known
        )

    async def execute_steps(self, steps: Sequence[Step]) -> list[Task | DomainError]:
        return await self.read.execute_steps(steps, fence=self.fence)

    async def execute_with_tasks(
        self,
        agg: Aggregate[M],
        agg_id: str,
        decide: Callable[[M | None], tuple[Sequence[Payload], Sequence[NewTask]]],
        *,
        metadata: dict[str, Any] | None = None,
        receipt: Receipt | None = None,
        generation: int = 0,
    ) -> tuple[M | None, list[Task]]:
        return await self.read.execute_with_tasks(
            agg,
            agg_id,
            decide,
            metadata=metadata,
            fence=self.fence,
            receipt=receipt,
            generation=generation,
        )

    async def execute_aggregate(
        self,
        agg: Aggregate[M],
        agg_id: str,
        decide: Callable[[M | None], Sequence[Payload]],
        *,
        metadata: dict[str, Any] | None = None,
        receipt: Receipt | None = None,
    ) -> M | None:
        return await self.read.execute_aggregate(
            agg, agg_id, decide, metadata=metadata, fence=self.fence, receipt=receipt
        )

    async def append_stream(
        self,
        stream_id: str,
        events: Sequence[Payload],
        *,
        expected_version: int | None = None,
        metadata: dict[str, Any] | None = None,
        receipt: Receipt | None = None,
    ) -> list[StoredEvent]:
        return await self.read.append_stream(
            stream_id,
            events,
            expected_version=expected_version,
            metadata=metadata,
            fence=self.fence,
            receipt=receipt,
        )


__all__ = ["FencedWriter"]
