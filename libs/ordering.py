"""A batch's place in line, for consumers that overlap their batches.

A pipelined consumer (`Routes.durable_batches(..., pipelined=True)`) fetches and starts its next
batch while the previous one is still committing. That keeps the order of a subject only if
the next batch cannot decide anything before the previous one's decisions are fixed: the store
says so by calling `mark_ordered()` once a transaction holds the row locks of everything it
will write (a later batch touching the same rows then waits for the commit, and reads what it
left). The consumer waits for that mark, or for the batch to end, before it starts the next.

A handler that runs more than one transaction for one batch must call `unordered()` first:
the first transaction's locks would otherwise let the next batch overtake the later ones.
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar

_ORDERED: ContextVar[asyncio.Event | None] = ContextVar("hf_batch_ordered", default=None)


def start_batch() -> asyncio.Event:
    """A new mark for the batch about to start in this context (a task created now copies it)."""
    mark = asyncio.Event()
    _ORDERED.set(mark)
    return mark


def mark_ordered() -> None:
    """The current batch's writes are locked in place: the next batch may start."""
    mark = _ORDERED.get()
    if mark is not None:
        mark.set()


def unordered() -> None:
    """This batch will not mark itself ordered: the next one starts when it has ended."""
    _ORDERED.set(None)
