"""The platform's own JetStream pull loop, on nats-py's public client API.

A durable consumer (`libs/bus/broker.py`) is served by one `PullLoop`: it subscribes to an
inbox of its own and asks the server for messages with JetStream's pull request, a plain
publish on ``$JS.API.CONSUMER.MSG.NEXT.<stream>.<durable>`` whose reply subject is that
inbox. The server answers there with the messages, and ends a request early with a status
message (no payload, a ``Status`` header): 404 (no messages, for a no-wait request), 408 (the
request expired), 409 (the consumer was deleted, a leader changed, a limit was exceeded); 100
is an idle heartbeat (never asked for here, skipped).

The server may also say the consumer is not there: 503 (no responders: nobody serves its
pull subject, so the consumer, or its whole stream, does not exist, as after a JetStream
store was lost and the server started empty) or 409 "Consumer Deleted". The loop then calls
its `redeclare` (the durable's create-or-update, `libs/bus/broker.py`) and goes on fetching:
a process that stayed connected across the loss consumes again as soon as the stream is back
(its declarer, `heteroflow up`, creates the streams when it starts), with nobody restarting it.

A fetch is eager: one request for a single message that waits up to `IDLE_FETCH_S` on the
server, then, once that message is in, one no-wait request for what the server already holds
behind it (up to the batch size). So a quiet subject adds nothing to a hop, and under load
what arrived while the last batch was being handled comes together in the next. Each batch is
handed over in delivery order.

`pipelined`: each batch runs as its own task with a fresh ordering mark (`libs/ordering.py`).
The loop hands a batch over and goes back to fetching; the next batch, once fetched, starts
when the one before it is ordered (its rows locked) or over, with at most `IN_FLIGHT`
batches running. Stopping waits for the batches still running; a plain loop's batch is
cancelled with it (what was not acknowledged is redelivered after `ack_wait`).

A message that came for an earlier request (one this loop stopped waiting for, say across a
reconnect) is still a message delivered to this consumer: it is taken with the next batch.

The inbox is a callback subscription feeding the loop's own buffer, not nats-py's
`next_msg`, which makes a task, an `asyncio.wait_for` and a uuid4 for every message it
returns (about 1.6 % of `up`'s CPU in `bench peer`'s burst), and on 3.11 could drop a
cancellation that met a message (the `stop` flag still covers that).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import nats.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from libs import ordering

log = structlog.get_logger(__name__)

# A pull waits this long on the server for a first message, then it is asked again.
IDLE_FETCH_S = 5.0
# Beyond the expiry, how long to wait for the server's 408 before asking again anyway.
EXPIRY_MARGIN_S = 1.0
# Only a server that does not answer a no-wait request at all takes this long.
PROBE_TIMEOUT_S = 1.0
# After a failed request (client reconnecting, consumer gone), wait this long to ask again.
RETRY_S = 0.5
# While the consumer cannot be declared again (its stream is not back yet), retry this often.
REDECLARE_RETRY_S = 1.0

STATUS = "Status"
HEARTBEAT = "100"
NO_RESPONDERS = "503"
CONSUMER_DELETED = "consumer deleted"

Consume = Callable[[list[Msg]], Coroutine[Any, Any, None]]
Redeclare = Callable[[], Awaitable[Any]]


def status_of(msg: Msg) -> str | None:
    """The status code of a JetStream status message, None for a message of the stream."""
    if msg.data or not msg.headers:
        return None
    return msg.headers.get(STATUS)


class PullLoop:
    """Fetches batches of one durable consumer and hands each to `consume`, in order."""

    IN_FLIGHT = 2

    def __init__(
        self,
        nc: Client,
        stream: str,
        durable: str,
        consume: Consume,
        *,
        batch: int,
        pipelined: bool = False,
        inbox_prefix: str | None = None,
        redeclare: Redeclare | None = None,
    ) -> None:
        self.nc = nc
        self.stream = stream
        self.durable = durable
        self.consume = consume
        self.batch = max(1, batch)
        self.pipelined = pipelined
        self.next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        # Under the process's own prefix: an agent may subscribe to no other inbox.
        prefix = inbox_prefix or "_INBOX"
        self.inbox = f"{prefix}.{uuid.uuid4().hex}"
        self._sub: Subscription | None = None
        self._inbox: deque[Msg] = deque()  # delivered to the inbox, not yet taken
        self._waiter: asyncio.Future[None] | None = None  # set by a delivery
        self._running: set[asyncio.Task[None]] = set()
        self._previous: asyncio.Task[None] | None = None
        self.redeclare = redeclare
        self._missing = False  # the server said the consumer does not exist
        self._stopping = False

    async def open(self) -> None:
        """Subscribe to the inbox (before the loop runs, so readiness follows it)."""
        self._sub = await self.nc.subscribe(self.inbox, cb=self._delivered)

    async def _delivered(self, msg: Msg) -> None:
        self._inbox.append(msg)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _next(self, timeout: float) -> Msg:  # noqa: ASYNC109
        """The next message delivered to the inbox, waiting up to `timeout` (TimeoutError)."""
        if not self._inbox:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(timeout):
                    await self._waiter
            finally:
                self._waiter = None
        return self._inbox.popleft()

    async def run(self) -> None:
        """Fetch and hand over until cancelled or `stop`ped."""
        if self._sub is None:
            await self.open()
        try:
            while not self._stopping:
                messages = await self._fetch()
                if messages and not self._stopping:  # else redelivered after ack_wait
                    await self._hand_over(messages)
        finally:
            await self._close()

    def stop(self, task: asyncio.Task[None]) -> None:
        """End the loop that `task` runs: cancel it, and have the loop end at its next turn
        if the cancellation is lost (on Python 3.11 one that met an `asyncio.wait_for`
        finishing could be dropped: libs/cancellation.py)."""
        self._stopping = True
        task.cancel()

    async def _close(self) -> None:
        if self._previous is not None:
            self._previous.cancel()
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    async def _fetch(self) -> list[Msg]:
        if self._missing:
            await self._declare_again()
        try:
            first = await self._request(1, {"expires": int(IDLE_FETCH_S * 1e9)}, IDLE_FETCH_S)
            if not first or self.batch == 1:
                return first
            return first + await self._request(self.batch - 1, {"no_wait": True}, 0.0)
        except nats.errors.NoRespondersError:
            self._missing = True
            return []
        except (nats.errors.Error, OSError) as exc:
            # The client reconnects; what was delivered and not acked comes back.
            log.warning("consumer_fetch_failed", consumer=self.durable, error=repr(exc))
            await asyncio.sleep(RETRY_S)
            return []

    async def _request(self, n: int, options: dict[str, Any], wait_s: float) -> list[Msg]:
        """Up to `n` messages: what is already in the inbox, then one pull request's answer."""
        assert self._sub is not None, "open() runs first"
        out: list[Msg] = []
        while len(out) < n and self._inbox:  # delivered for an earlier request
            msg = self._inbox.popleft()
            if status_of(msg) is None:
                out.append(msg)
        if len(out) >= n:
            return out
        body = json.dumps({"batch": n - len(out), **options}).encode()
        await self.nc.publish(self.next_subject, body, reply=self.inbox)
        deadline = time.monotonic() + wait_s + (EXPIRY_MARGIN_S if wait_s else PROBE_TIMEOUT_S)
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                msg = await self._next(left)
            except TimeoutError:
                break  # what still comes waits in the inbox for the next request
            if self._stopping:
                break
            status = status_of(msg)
            if status is None:
                out.append(msg)
            elif status == HEARTBEAT:
                continue
            else:
                reason = (msg.headers or {}).get("Description", "")
                if status == NO_RESPONDERS or (
                    status == "409" and reason.lower() == CONSUMER_DELETED
                ):
                    self._missing = True
                elif status == "409":
                    log.warning("consumer_pull_refused", consumer=self.durable, reason=reason)
                    await asyncio.sleep(RETRY_S)
                break  # 404: nothing more; 408/409: this request is over
        return out

    async def _declare_again(self) -> None:
        """The server said the consumer does not exist: declare it again (once its stream is
        back), or wait a moment when there is no way to (no `redeclare`) or it failed."""
        if self.redeclare is None:
            log.warning("consumer_missing", consumer=self.durable, stream=self.stream)
            await asyncio.sleep(REDECLARE_RETRY_S)
            return
        try:
            await self.redeclare()
        except Exception as exc:  # stream not found (not declared again yet), reconnecting
            log.warning(
                "consumer_redeclare_failed",
                consumer=self.durable,
                stream=self.stream,
                error=repr(exc),
            )
            await asyncio.sleep(REDECLARE_RETRY_S)
            return
        self._missing = False
        log.warning("consumer_redeclared", consumer=self.durable, stream=self.stream)

    async def _hand_over(self, messages: list[Msg]) -> None:
        if not self.pipelined:
            await self.consume(messages)
            return
        if self._previous is not None:
            await asyncio.shield(self._previous)  # the batch before is ordered, or over
        while len(self._running) >= self.IN_FLIGHT:
            await asyncio.wait(self._running, return_when=asyncio.FIRST_COMPLETED)
        context = contextvars.copy_context()
        mark = context.run(ordering.start_batch)
        batch = asyncio.create_task(self.consume(messages), context=context)
        self._running.add(batch)
        batch.add_done_callback(self._running.discard)
        self._previous = asyncio.create_task(_ordered_or_over(batch, mark))


async def _ordered_or_over(batch: asyncio.Task[None], mark: asyncio.Event) -> None:
    ordered = asyncio.create_task(mark.wait())
    try:
        await asyncio.wait({batch, ordered}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        ordered.cancel()


__all__ = ["IDLE_FETCH_S", "PullLoop", "status_of"]
