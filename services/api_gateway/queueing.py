"""Which queue a submission goes into, and whether its request fits that queue's quota.

Every task is submitted into a queue: the one it names, else its tenant's default queue;
a tenant with no queue at all keeps the behaviour from before queues (tenant quota only).
A request that could never fit the queue's quota is refused at submission, naming the limit.
"""

from __future__ import annotations

from libs.domain.errors import Code, DomainError
from libs.domain.pool.model import Queue
from libs.domain.task.model import TaskSpec
from libs.store import queues as queue_rows
from libs.store.eventstore import EventStore


async def queue_for(
    store: EventStore, tenant_id: str, name: str, field: str = "queue"
) -> Queue | None:
    """The tenant's queue called `name` ("" = its default queue, None when it has none)."""
    if not name:
        return await queue_rows.default_of(store, tenant_id)
    queue = await queue_rows.get(store, name)
    if queue is None or queue.spec.tenant != tenant_id:
        raise DomainError(Code.INVALID_VALUE, f"unknown queue {name!r}", [field])
    return queue


def check_fits(queue: Queue, spec: TaskSpec, field: str = "gpu_required") -> None:
    """Refuse a task that needs more cards than its queue may ever hold (with variants: a
    variant that does, each named; docs/scheduling.md#variants)."""
    limit = queue.spec.quota.max_gpus
    asks = [(field, spec.gpu_required)] + [
        (f"variants.{i}.gpu_required", v.gpu_required) for i, v in enumerate(spec.variants)
    ]
    over = [(name, cards) for name, cards in asks if limit and cards > limit]
    if over:
        raise DomainError(
            Code.INVALID_VALUE,
            "; ".join(
                f"{name} {cards} exceeds queue {queue.spec.name!r} quota max_gpus {limit}"
                for name, cards in over
            ),
            [name for name, _ in over],
        )


async def into_queue(store: EventStore, tenant_id: str, spec: TaskSpec) -> TaskSpec:
    """`spec` with its queue resolved (and checked against the quota)."""
    queue = await queue_for(store, tenant_id, spec.queue)
    if queue is None:
        return spec
    check_fits(queue, spec)
    return spec if spec.queue else spec.model_copy(update={"queue": queue.spec.name})
