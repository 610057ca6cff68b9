"""Per-key lanes: messages of one key handled in order, different keys concurrently.

A durable consumer that declares lanes (`Routes.durable(..., lane=...)`) hands each message of
a fetched batch to the lane of its key and moves on; the lane runs its messages one after the
other, and each is acknowledged when its handler returns, as on the sequential path. So order
holds where it matters (a task's `start` before its `stop`) while one slow message no longer
holds up every other key's. `max_in_flight` bounds the messages admitted and not yet handled:
`submit` waits for a slot, which stops the consumer from fetching more while the lanes are full.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable

Job = Callable[[], Awaitable[None]]


class LanePool:
    def __init__(self, max_in_flight: int) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.max_in_flight = max_in_flight
        self._slots = asyncio.Semaphore(max_in_flight)
        self._lanes: dict[str, deque[Job]] = {}
        self._workers: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        return sum(len(q) for q in self._lanes.values())

    async def submit(self, key: str, job: Job) -> None:
        """Queue `job` behind the earlier jobs of `key`; returns once a slot is held."""
        await self._slots.acquire()
        lane = self._lanes.get(key)
        if lane is not None:
            lane.append(job)  # its worker is running and will get to it
            return
        self._lanes[key] = deque([job])
        worker = asyncio.create_task(self._drain(key), name=f"lane-{key}")
        self._workers.add(worker)
        worker.add_done_callback(self._workers.discard)

    async def _drain(self, key: str) -> None:
        lane = self._lanes[key]
        try:
            while lane:
                job = lane[0]
                try:
                    await job()  # jobs settle their own message (ack or nak); never raise here
                finally:
                    lane.popleft()
                    self._slots.release()
        finally:
            # The lane is empty (or cancelled): the next message of `key` starts a new worker.
            if self._lanes.get(key) is lane:
                del self._lanes[key]

    async def idle(self) -> None:
        """Wait until every admitted job has been handled (tests, orderly shutdown)."""
        while self._workers:
            await asyncio.gather(*list(self._workers), return_exceptions=True)

    async def close(self) -> None:
        """Cancel what is still queued; unacknowledged messages are redelivered later."""
        for worker in list(self._workers):
            worker.cancel()
        for worker in list(self._workers):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await worker
