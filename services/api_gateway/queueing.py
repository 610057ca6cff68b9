"""Which queue a submission goes into, and whether its request fits that queue's quota.

Every task is submitted into a queue: the one it names, else its tenant's default queue;
a tenant with no queue at all keeps the behaviour from before queues (tenant quota only).
A request that could never fit the queue's quota is refused at submission, naming the limit.

A create reuses the queue this process resolved the tenant's last submission to
(`HeldQueues`) instead of reading it again, and is written under a guard that the queue is
still at that version (or that the tenant still has no default queue): a queue created,
changed or deleted through another gateway worker, once committed, makes the guarded create
write nothing, and the submission is resolved again from the store. A create so sees every
queue committed before it, as it did when it read the queue itself.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from libs.domain.errors import Code, DomainError
from libs.domain.pool.model import Queue
from libs.domain.task.model import Task, TaskSpec, TenantId
from libs.store import queues as queue_rows
from libs.store.eventstore import EventStore, GuardFailed


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
    return _in(await queue_for(store, tenant_id, spec.queue), spec)


def _in(queue: Queue | None, spec: TaskSpec) -> TaskSpec:
    if queue is None:
        return spec
    check_fits(queue, spec)
    return spec if spec.queue else spec.model_copy(update={"queue": queue.spec.name})


class HeldQueues:
    """The queue (or the absence of a default one) each (tenant, queue name) of a recent
    submission resolved to in this process, newest last, at most `limit` of them."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._held: OrderedDict[tuple[str, str], Queue | None] = OrderedDict()

    def get(self, tenant_id: str, name: str) -> tuple[bool, Queue | None]:
        key = (tenant_id, name)
        if key not in self._held:
            return False, None
        self._held.move_to_end(key)
        return True, self._held[key]

    def put(self, tenant_id: str, name: str, queue: Queue | None) -> None:
        self._held[(tenant_id, name)] = queue
        self._held.move_to_end((tenant_id, name))
        while len(self._held) > self.limit:
            self._held.popitem(last=False)

    def drop(self, tenant_id: str, name: str) -> None:
        self._held.pop((tenant_id, name), None)


async def create_in_queue(
    store: EventStore,
    held: HeldQueues,
    tenant_id: str,
    spec: TaskSpec,
    metadata: dict[str, Any],
) -> Task:
    """Create the task in its queue (see the module doc): under a guard on the queue this
    process holds, else after reading it."""
    tenant, name = TenantId(tenant_id), spec.queue
    hit, queue = held.get(tenant_id, name)
    if hit:
        try:
            resolved: TaskSpec | None = _in(queue, spec)
        except DomainError:
            resolved = None  # refused by the queue as it is held: ask the store first
        if resolved is not None:
            guard = queue_rows.unchanged(queue) if queue else queue_rows.no_default(tenant_id)
            try:
                return await store.create_task(tenant, resolved, metadata=metadata, guard=guard)
            except GuardFailed:
                pass  # the queue moved: nothing was written; ask the store
        held.drop(tenant_id, name)
    queue = await queue_for(store, tenant_id, name)
    resolved = _in(queue, spec)
    held.put(tenant_id, name, queue)
    return await store.create_task(tenant, resolved, metadata=metadata)
