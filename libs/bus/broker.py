"""FastStream on the platform's NATS connection: typed subscribers for every subject.

A process declares what it consumes as `Routes`: durable JetStream consumers (`durable`) and
core NATS subscriptions (`core`), each taking a pydantic message model. The models are what the
AsyncAPI document is generated from (`heteroflow/asyncapi.py`), so a subject cannot be consumed
without being documented. `serve` runs them on the process's existing client: durable
consumers through FastStream, core subscriptions through nats-py beneath it (see `Routes.core`).

Durable consumers keep the platform's delivery contract: explicit ack per message, a failed
handler nak'ed with a delay, `max_deliver` attempts, then a max-deliveries advisory that
`forward_dead_letters` turns into ``hf.dlq.<subject>``. They are FastStream *batch* pull
subscribers on purpose: a fetched batch is handled in order, one message after the other (the
plain pull subscriber runs a batch's messages concurrently, and an agent must see a task's
`start` before its `stop`, the scheduler a `starting` report before `running`).

`durable_batches` hands the handler the whole fetched batch instead, in order, and takes back
one outcome per message (acked, or nak'ed alone): a hot consumer then decides a batch together
and commits it in one transaction, keeping the order within it. A pipelined one also fetches
and starts the next batch while the previous one commits, once the store has marked the
previous one's writes locked in place (`libs/ordering.py`), so two reports of one task that
land in consecutive batches are one commit apart, not a commit, an ack and two fetches.
"""

import asyncio
import contextlib
import contextvars
import functools
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

import nats.errors
import structlog
from faststream import Context
from faststream.middlewares import AckPolicy
from faststream.nats import JStream, NatsBroker, NatsRouter, PullSub
from faststream.nats.message import NatsBatchMessage
from faststream.nats.subscriber.usecases.stream_pull_subscriber import BatchPullStreamSubscriber
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import ConnectionClosedError
from nats.js import JetStreamContext
from nats.js.errors import ServiceUnavailableError
from prometheus_client import Counter
from pydantic import BaseModel, ValidationError

from libs import ordering
from libs.health import READINESS

from .lanes import LanePool
from .nats import ensure_durable_consumer, when_jetstream_answers

log = structlog.get_logger(__name__)

M = TypeVar("M", bound=BaseModel)
Handle = Callable[[M], Awaitable[None]]
# A batch handler: the batch in delivery order in, one outcome per message out (None: done,
# ack; an exception: nak that message alone).
HandleBatch = Callable[[list[M]], Awaitable[Sequence[BaseException | None]]]

HANDLED = Counter(
    "heteroflow_consumer_messages_total",
    "Messages handled by durable consumers",
    ["consumer", "result"],
)
REDELIVERED = Counter(
    "heteroflow_consumer_redeliveries_total", "Messages seen more than once", ["consumer"]
)

# A batch pull waits this long for a first message, then asks again (see _EagerBatchPull).
IDLE_FETCH_S = 5.0
# Only a server that does not answer a no-wait probe at all takes this long.
PROBE_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Durable:
    """A durable pull consumer as declared on the server."""

    stream: str
    durable: str
    subject: str  # the filter, wildcards in place of {parameters}
    ack_wait: float
    max_deliver: int
    deliver_new: bool


def _filter(subject: str) -> str:
    """``hf.node.{node_id}.cmd`` -> ``hf.node.*.cmd`` (FastStream's parameter syntax)."""
    return ".".join("*" if t.startswith("{") and t.endswith("}") else t for t in subject.split("."))


@dataclass(frozen=True)
class Core:
    """A core NATS subscription as declared: its model, handler, filter and queue group."""

    model: type[BaseModel]
    handle: Callable[[Any], Awaitable[Any]]
    subject: str
    queue: str
    replies: bool
    accept: Callable[[str, BaseModel], bool] | None = None
    owner: str = ""

    def callback(self) -> Callable[[Msg], Awaitable[None]]:
        async def receive(msg: Msg) -> None:
            try:
                item = self.model.model_validate_json(msg.data)
            except ValidationError as exc:
                log.warning("core_bad_message", subject=msg.subject, error=str(exc)[:200])
                return
            if self.accept is not None and not self.accept(msg.subject, item):
                log.warning("core_message_refused", owner=self.owner, subject=msg.subject)
                HANDLED.labels(f"{self.owner}:core", "refused").inc()
                return
            try:
                answer = await self.handle(item)
            except Exception:
                log.exception("core_handler_failed", subject=msg.subject)
                return
            if self.replies and msg.reply:
                body = answer.model_dump_json() if isinstance(answer, BaseModel) else answer
                with contextlib.suppress(Exception):
                    await msg.respond(body.encode() if isinstance(body, str) else body)

        return receive


@dataclass
class Routes:
    """The subscribers of one service (or agent), on a FastStream router."""

    owner: str  # the process, as channel titles show it
    router: NatsRouter = field(default_factory=NatsRouter)
    durables: list[Durable] = field(default_factory=list)
    pools: list[LanePool] = field(default_factory=list)
    cores: list["Core"] = field(default_factory=list)
    # Core subscriptions as FastStream documents them (served with nats-py, see `core`).
    documented: NatsRouter = field(default_factory=NatsRouter)
    # Where pulled batches are delivered: an agent's NATS user may subscribe only to inboxes
    # under its own prefix (libs/bus/permissions.py); None keeps FastStream's `_INBOX.`.
    inbox_prefix: str | None = None

    def durable(
        self,
        model: type[M],
        handle: Handle[M],
        *,
        stream: str,
        durable: str,
        subject: str,
        description: str,
        batch: int = 256,
        ack_wait: float = 30.0,
        max_deliver: int = 8,
        nak_delay: float = 1.0,
        deliver_new: bool = False,
        lane: Callable[[M], str] | None = None,
        max_in_flight: int = 1,
    ) -> None:
        """Consume `subject` through the durable `durable`, each message as a `model`.

        `handle` must be idempotent (a lost ack redelivers). It raising naks the message with
        `nak_delay`; so does a body that is not a `model`. With `lane`, messages are handled
        in order per `lane(message)` key and concurrently across keys, at most
        `max_in_flight` at a time (libs/bus/lanes.py); without, strictly one after the other.
        """

        pool = LanePool(max_in_flight) if lane is not None else None
        if pool is not None:
            self.pools.append(pool)

        async def each(raws: list[Msg], batch: list[BaseModel]) -> None:
            for raw, item in zip(raws, batch, strict=True):
                if pool is None or lane is None:
                    await _handle(raw, item, handle, durable, nak_delay)
                    continue

                async def job(raw: Msg = raw, item: Any = item) -> None:
                    await _handle(raw, item, handle, durable, nak_delay)

                await pool.submit(lane(item), job)  # type: ignore[arg-type]

        self._subscribe(model, each, stream, durable, subject, description, batch, nak_delay)
        self.durables.append(
            Durable(stream, durable, _filter(subject), ack_wait, max_deliver, deliver_new)
        )

    def durable_batches(
        self,
        model: type[M],
        handle: HandleBatch[M],
        *,
        stream: str,
        durable: str,
        subject: str,
        description: str,
        batch: int = 256,
        ack_wait: float = 30.0,
        max_deliver: int = 8,
        nak_delay: float = 1.0,
        deliver_new: bool = False,
        accept: Callable[[str, M], bool] | None = None,
        pipelined: bool = False,
    ) -> None:
        """Like `durable`, but `handle` gets each fetched batch whole, in delivery order, and
        returns one outcome per message: None acks it, an exception naks it alone. `handle`
        raising naks the whole batch. `accept(subject, message)` False: the message is
        logged, counted (`refused`) and terminated, never handled nor redelivered.
        `pipelined`: the next batch starts once this one is ordered (see `libs/ordering.py`);
        only for handlers whose writes go through the store's locked task steps."""

        async def whole(raws: list[Msg], items: list[BaseModel]) -> None:
            if accept is not None:
                raws, items = await _accepted(raws, items, accept, durable)  # type: ignore[arg-type]
            if raws:
                await _handle_batch(raws, items, handle, durable, nak_delay)

        kind = _PipelinedBatchPull if pipelined else _EagerBatchPull
        self._subscribe(model, whole, stream, durable, subject, description, batch, nak_delay, kind)
        self.durables.append(
            Durable(stream, durable, _filter(subject), ack_wait, max_deliver, deliver_new)
        )

    def _subscribe(
        self,
        model: type[M],
        run: Callable[[list[Msg], list[BaseModel]], Awaitable[None]],
        stream: str,
        durable: str,
        subject: str,
        description: str,
        batch: int,
        nak_delay: float,
        kind: type[BatchPullStreamSubscriber] | None = None,
    ) -> None:
        """The FastStream batch pull subscriber behind `durable` and `durable_batches`."""

        async def decode(message: NatsBatchMessage) -> list[BaseModel]:
            # Validated one by one, so one bad body does not take its batch down with it.
            out: list[BaseModel] = []
            for raw in message.raw_message:
                try:
                    out.append(model.model_validate_json(raw.data))
                except ValidationError:
                    log.exception("consumer_bad_message", consumer=durable, subject=raw.subject)
                    HANDLED.labels(durable, "error").inc()
                    with contextlib.suppress(Exception):
                        await raw.nak(delay=nak_delay)
            return out

        async def consume(batch: list[Any], message: NatsBatchMessage = Context("message")) -> None:
            # `decode` settled the bad ones: what is left pairs with `batch` in order.
            pending = [raw for raw in message.raw_message if not raw.is_acked]
            await run(pending, batch)

        # The model in the annotation is what FastStream documents for this channel.
        consume.__annotations__["batch"] = list[model]  # type: ignore[valid-type]
        subscriber = self.router.subscriber(
            subject,
            stream=JStream(stream, declare=False),
            durable=durable,
            pull_sub=PullSub(batch_size=batch, timeout=IDLE_FETCH_S, batch=True),
            decoder=decode,
            ack_policy=AckPolicy.MANUAL,
            title=f"{durable}:{subject}",
            description=description,
            inbox_prefix=f"{self.inbox_prefix or '_INBOX'}.".encode(),
        )
        subscriber(consume)
        subscriber.__class__ = kind or _EagerBatchPull

    def core(
        self,
        model: type[M],
        handle: Callable[[M], Awaitable[Any]],
        *,
        subject: str,
        description: str,
        queue: str = "",
        replies: bool = False,
        accept: Callable[[str, M], bool] | None = None,
    ) -> None:
        """A core NATS subscription: nothing stored, nothing redelivered.

        With `replies`, what `handle` returns answers a request. Without, nothing is sent: a
        JetStream publish also carries a reply subject (its ack inbox), and a listener on the
        same subject answering it would hand the publisher a bogus ack. `accept(subject,
        message)` False: the message is logged, counted (`refused`) and dropped.

        The declaration documents the channel through FastStream, but `serve` subscribes with
        nats-py: core subjects are the platform's busiest (every node's heartbeat, every task
        event waking the placer), and FastStream's per-message machinery (context, dependency
        injection, middlewares) cost the scheduler about a sixth of its CPU at 1,000 nodes.
        """

        async def receive(message: Any) -> Any:
            return await handle(message)

        receive.__annotations__["message"] = model
        self.documented.subscriber(
            subject,
            queue=queue,
            no_reply=not replies,
            title=f"{self.owner}:{subject}",
            description=description,
        )(receive)
        self.cores.append(
            Core(model, handle, _filter(subject), queue, replies, accept, self.owner)  # type: ignore[arg-type]
        )

    def publishes(
        self, model: Any, *, subject: str, description: str, kind: str = "publish"
    ) -> None:
        """Declare a subject this process publishes on, with its message model.

        The hot paths publish with nats-py (`js.publish` of `model_dump_json()`), which costs
        less per message than FastStream's publisher; the declaration is what documents them.
        """
        self.router.publisher(
            subject,
            schema=model,
            title=f"{self.owner}.{kind}:{subject}",
            description=description,
        )


async def _handle(
    raw: Msg, item: BaseModel, handle: Handle[Any], durable: str, delay: float
) -> None:
    if raw.metadata.num_delivered > 1:
        REDELIVERED.labels(durable).inc()
    try:
        await handle(item)
    except Exception:
        log.exception(
            "consumer_handler_failed",
            consumer=durable,
            subject=raw.subject,
            delivered=raw.metadata.num_delivered,
        )
        HANDLED.labels(durable, "error").inc()
        with contextlib.suppress(Exception):
            await raw.nak(delay=delay)
        return
    HANDLED.labels(durable, "ok").inc()
    with contextlib.suppress(Exception):
        await raw.ack()


async def _accepted(
    raws: list[Msg],
    items: list[BaseModel],
    accept: Callable[[str, BaseModel], bool],
    durable: str,
) -> tuple[list[Msg], list[BaseModel]]:
    kept: tuple[list[Msg], list[BaseModel]] = ([], [])
    for raw, item in zip(raws, items, strict=True):
        if accept(raw.subject, item):
            kept[0].append(raw)
            kept[1].append(item)
            continue
        log.warning("consumer_message_refused", consumer=durable, subject=raw.subject)
        HANDLED.labels(durable, "refused").inc()
        with contextlib.suppress(Exception):
            await raw.term()
    return kept


async def _handle_batch(
    raws: list[Msg], items: list[BaseModel], handle: HandleBatch[Any], durable: str, delay: float
) -> None:
    for raw in raws:
        if raw.metadata.num_delivered > 1:
            REDELIVERED.labels(durable).inc()
    outcomes: Sequence[BaseException | None]
    try:
        outcomes = await handle(items)
        if len(outcomes) != len(items):
            raise RuntimeError(f"{len(outcomes)} outcomes for a batch of {len(items)}")
    except Exception as exc:
        log.exception("consumer_batch_failed", consumer=durable, messages=len(items))
        outcomes = [exc] * len(items)
    for raw, outcome in zip(raws, outcomes, strict=True):
        if outcome is None:
            HANDLED.labels(durable, "ok").inc()
            with contextlib.suppress(Exception):
                await raw.ack()
            continue
        log.warning(
            "consumer_message_failed",
            consumer=durable,
            subject=raw.subject,
            delivered=raw.metadata.num_delivered,
            error=repr(outcome),
        )
        HANDLED.labels(durable, "error").inc()
        with contextlib.suppress(Exception):
            await raw.nak(delay=delay)


class _EagerBatchPull(BatchPullStreamSubscriber):
    """FastStream's batch pull subscriber, fetching eagerly.

    FastStream 0.7's loop keeps fetching until the batch is full or `PullSub.timeout` has
    passed since the first fetch, so every message waits out a window, and a quiet consumer
    wakes once per window to ask again. Here a fetch waits for one message, then takes what
    the server already holds behind it (`_take_available`) and hands the batch over: a quiet
    subject adds nothing to a hop, and under load what arrived during the last batch comes
    together in the next.
    """

    __slots__ = ()

    async def _consume_pull(self) -> None:
        assert self.subscription is not None, "create_subscription runs first"
        size = self.pull_sub.batch_size
        while self.running:
            try:
                messages = await self.subscription.fetch(batch=1, timeout=IDLE_FETCH_S)
                if size > 1:
                    messages += await _take_available(self.subscription, size - 1)
            except TimeoutError:
                continue  # nothing yet: ask again
            except (ConnectionClosedError, ServiceUnavailableError, nats.errors.Error) as exc:
                # The client reconnects; what was fetched and not acked comes back.
                log.warning("consumer_fetch_failed", subject=self.subject, error=repr(exc))
                await asyncio.sleep(0.5)
                continue
            if messages and self.running:
                await self._hand_over(messages)

    async def _hand_over(self, messages: list[Msg]) -> None:
        await self.consume(messages)


class _PipelinedBatchPull(_EagerBatchPull):
    """An eager batch pull that fetches and starts its next batch while the previous commits.

    Each batch runs as its own task with a fresh ordering mark (`libs/ordering.py`). A batch
    is handed over at once and the loop goes back to fetching; the next batch, once fetched,
    starts when the one before it is ordered (its rows locked) or over, with at most
    `IN_FLIGHT` batches running. So the fetch of the next batch overlaps the previous one's
    locking, and a report that arrived during it is already in hand when the locks are
    taken. Stopping waits for the batches still running.
    """

    __slots__ = ()
    IN_FLIGHT = 2

    def _batches(self) -> set[asyncio.Task[Any]]:
        # Kept in the instance's __dict__: the class is swapped in after construction.
        running: set[asyncio.Task[Any]] = vars(self).setdefault("_hf_batches", set())
        return running

    async def _consume_pull(self) -> None:
        try:
            await super()._consume_pull()
        finally:
            previous = vars(self).pop("_hf_previous", None)
            if previous is not None:
                previous.cancel()
            running = self._batches()
            if running:
                await asyncio.gather(*running, return_exceptions=True)

    async def _hand_over(self, messages: list[Msg]) -> None:
        previous: asyncio.Task[None] | None = vars(self).get("_hf_previous")
        if previous is not None:
            await asyncio.shield(previous)  # the batch before is ordered, or over
        running = self._batches()
        while len(running) >= self.IN_FLIGHT:
            await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        context = contextvars.copy_context()
        mark = context.run(ordering.start_batch)
        batch = asyncio.create_task(self.consume(messages), context=context)
        running.add(batch)
        batch.add_done_callback(running.discard)
        vars(self)["_hf_previous"] = asyncio.create_task(_ordered_or_over(batch, mark))


async def _ordered_or_over(batch: asyncio.Task[Any], mark: asyncio.Event) -> None:
    ordered = asyncio.create_task(mark.wait())
    try:
        await asyncio.wait({batch, ordered}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        ordered.cancel()


async def _take_available(sub: JetStreamContext.PullSubscription, n: int) -> list[Msg]:
    """Up to `n` messages the server holds for `sub` right now, without waiting for new ones.

    nats-py's `fetch` cannot say this: its no-wait probe carries an expiry whenever its local
    queue is empty, and the server then holds the request open that long. This sends the
    probe without one (the server answers with what it has, then a 404 status when that is
    fewer than asked) on the subscription's own inbox, as `fetch` does.
    """
    inner = sub._sub
    assert inner is not None
    queue = inner._pending_queue
    out: list[Msg] = []
    while len(out) < n and not queue.empty():  # delivered for an earlier request, not taken
        msg = queue.get_nowait()
        inner._pending_size -= len(msg.data)
        if not JetStreamContext.is_status_msg(msg):
            out.append(msg)
    if len(out) >= n:
        return out
    probe = json.dumps({"batch": n - len(out), "no_wait": True}).encode()
    await sub._nc.publish(sub._nms, probe, sub._deliver)
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    while len(out) < n:
        try:
            msg = await inner.next_msg(timeout=max(deadline - time.monotonic(), 0.001))
        except TimeoutError:
            break  # what still comes waits in the queue for the next fetch
        status = JetStreamContext.is_status_msg(msg)
        if status is None:
            out.append(msg)
        elif not JetStreamContext._is_heartbeat(status):
            break  # 404: nothing more (or 408/409: this request is over)
    return out


class SharedBroker(NatsBroker):
    """A NatsBroker on a client the process already holds (credentials, reconnect policy and
    the lease live on it); stopping the broker leaves the client open."""

    def __init__(self, nc: Client, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._shared = nc

    async def _connect(self) -> Client:
        self.config.connect(self._shared)
        state = self.config.connection_state
        state.connect(self._shared, _translating_timeouts(state.stream))
        return self._shared

    async def stop(
        self,
        exc_type: type[BaseException] | None = None,
        exc_val: BaseException | None = None,
        exc_tb: TracebackType | None = None,
    ) -> None:
        self._connection = None  # not ours to drain
        await super().stop(exc_type, exc_val, exc_tb)


def _translating_timeouts(js: JetStreamContext) -> JetStreamContext:
    """Make pull fetches raise `nats.errors.TimeoutError` when they time out.

    nats-py 2.16 raises the builtin TimeoutError from a batch fetch that got nothing more,
    while FastStream 0.7's batch loop catches only nats-py's own: the consume task then dies
    with the batch it had collected (redelivered only after `ack_wait`) and is restarted.
    """
    pull_subscribe = js.pull_subscribe

    async def subscribe(*args: Any, **kwargs: Any) -> Any:
        sub = await pull_subscribe(*args, **kwargs)
        fetch = sub.fetch

        async def translated(*a: Any, **kw: Any) -> list[Msg]:
            try:
                return await fetch(*a, **kw)
            except nats.errors.TimeoutError:
                raise
            except TimeoutError as exc:
                raise nats.errors.TimeoutError from exc

        sub.fetch = translated  # type: ignore[method-assign]
        return sub

    js.pull_subscribe = subscribe  # type: ignore[method-assign]
    return js


def broker_for(nc: Client | None, routes: Sequence[Routes]) -> NatsBroker:
    """A broker holding `routes`; unconnected (`nc` None) it serves to generate documents."""
    # FastStream's per-message logging would double ours and cost a log line per message.
    kwargs: dict[str, Any] = {"logger": None, "apply_types": True}
    broker = SharedBroker(nc, **kwargs) if nc is not None else NatsBroker(**kwargs)
    for r in routes:
        broker.include_router(r.router)
        if nc is None:
            broker.include_router(r.documented)
    return broker


async def declare(js: JetStreamContext, routes: Sequence[Routes]) -> None:
    """Create or update the durable consumers of `routes` (bounded redelivery, explicit ack)."""
    for r in routes:
        for d in r.durables:
            await when_jetstream_answers(
                f"consumer {d.durable}",
                functools.partial(
                    ensure_durable_consumer,
                    js,
                    d.stream,
                    d.durable,
                    d.subject,
                    ack_wait=d.ack_wait,
                    max_deliver=d.max_deliver,
                    deliver_new=d.deliver_new,
                ),
            )


async def serve(nc: Client, routes: Sequence[Routes], stop: asyncio.Event) -> None:
    """Run `routes` on `nc` until `stop` is set."""
    await declare(nc.jetstream(), routes)
    broker = broker_for(nc, routes)
    await broker.start()
    subs = [
        await nc.subscribe(c.subject, queue=c.queue, cb=c.callback())
        for r in routes
        for c in r.cores
    ]
    durables = [d.durable for r in routes for d in r.durables]
    for name in durables:
        READINESS.consumer_started(name)  # the process's /readyz waits for these
    try:
        await stop.wait()
    finally:
        for name in durables:
            READINESS.consumer_stopped(name)
        for sub in subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        await broker.stop()
        for pool in (p for r in routes for p in r.pools):
            await pool.close()  # what is still queued is redelivered, unacknowledged


__all__ = [
    "HANDLED",
    "REDELIVERED",
    "Durable",
    "HandleBatch",
    "Routes",
    "broker_for",
    "serve",
]
