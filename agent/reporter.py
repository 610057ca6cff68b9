"""The agent's report publisher: reports go out in the order they were made, pipelined.

A command handler queues its reports and goes on (a start does not wait for its `starting`
report to be acknowledged before it starts the process); one loop publishes what is queued as
a pipeline of JetStream publishes and waits for their acknowledgements together. One queue for
the whole agent keeps every task's reports in order on the stream (the scheduler applies a
task's `starting` before its `running`). Each report carries its own `Nats-Msg-Id`, so a
batch republished after a lost acknowledgement is stored once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass, field

import structlog
from nats.js import JetStreamContext
from nats.js.api import PubAck
from prometheus_client import Counter

log = structlog.get_logger(__name__)

PUBLISH_FAILURES = Counter(
    "heteroflow_agent_report_publish_failures_total",
    "Report batches whose publish or acknowledgement failed (retried)",
)

# Pause between attempts at a batch the stream did not acknowledge.
RETRY_DELAY_S = 0.5


@dataclass
class Outgoing:
    subject: str
    payload: bytes
    done: asyncio.Future[None]
    msg_id: str = field(default_factory=lambda: uuid.uuid4().hex)


class Reporter:
    def __init__(
        self, js: JetStreamContext, *, max_batch: int = 256, ack_timeout_s: float = 10.0
    ) -> None:
        self.js = js
        self.max_batch = max_batch
        self.ack_timeout_s = ack_timeout_s
        self._queue: list[Outgoing] = []
        self._ready = asyncio.Event()

    def put(self, subject: str, payload: bytes) -> asyncio.Future[None]:
        """Queue one report; the future resolves once the stream has acknowledged it."""
        out = Outgoing(subject, payload, asyncio.get_running_loop().create_future())
        self._queue.append(out)
        self._ready.set()
        return out.done

    @property
    def pending(self) -> int:
        return len(self._queue)

    async def run(self, stop: asyncio.Event, flush_s: float = 5.0) -> None:
        """Publish until `stop`; then flush what is queued, for at most `flush_s`."""
        stopped = asyncio.create_task(stop.wait())
        try:
            while not stop.is_set():
                if not self._queue:
                    self._ready.clear()
                    ready = asyncio.create_task(self._ready.wait())
                    await asyncio.wait({ready, stopped}, return_when=asyncio.FIRST_COMPLETED)
                    ready.cancel()
                    continue
                await self._publish_head()
            deadline = time.monotonic() + flush_s
            while self._queue and time.monotonic() < deadline:
                await self._publish_head()
            if self._queue:
                log.warning("reports_not_flushed", pending=len(self._queue))
        finally:
            stopped.cancel()
            for out in self._queue:
                if not out.done.done():
                    out.done.cancel()

    async def _publish_head(self) -> None:
        """Publish the head of the queue; drop from it the acknowledged prefix."""
        batch = self._queue[: self.max_batch]
        acked = await self._publish(batch)
        for out in batch[:acked]:
            if not out.done.done():
                out.done.set_result(None)
        del self._queue[:acked]
        if acked < len(batch):
            PUBLISH_FAILURES.inc()
            await asyncio.sleep(RETRY_DELAY_S)

    async def _publish(self, batch: list[Outgoing]) -> int:
        """Length of the acknowledged prefix of `batch` (order on the stream is send order)."""
        futures: list[asyncio.Future[PubAck]] = []
        try:
            for out in batch:
                futures.append(
                    await self.js.publish_async(
                        out.subject,
                        out.payload,
                        wait_stall=self.ack_timeout_s,
                        headers={"Nats-Msg-Id": out.msg_id},
                    )
                )
        except Exception as exc:  # stalled or disconnected: count what did go out
            log.warning("report_publish_failed", error=repr(exc))
        results: list[PubAck | BaseException | None]
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*futures, return_exceptions=True), self.ack_timeout_s
            )
        except TimeoutError:
            log.warning("report_ack_timeout", pending=len(futures))
            results = [_outcome(f) for f in futures]
        for i, result in enumerate(results):
            if not isinstance(result, PubAck):
                return i
        return len(results)


def _outcome(future: asyncio.Future[PubAck]) -> PubAck | None:
    if future.done() and not future.cancelled():
        with contextlib.suppress(Exception):
            return future.result()
    return None
