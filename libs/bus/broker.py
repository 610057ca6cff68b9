"""FastStream on the platform's NATS connection: typed subscribers for every subject.

A process declares what it consumes as `Routes`: durable JetStream consumers (`durable`) and
core NATS subscriptions (`core`), each taking a pydantic message model. The models are what the
AsyncAPI document is generated from (`heteroflow/asyncapi.py`), so a subject cannot be consumed
without being documented. `serve` runs them on the process's existing client.

Durable consumers keep the platform's delivery contract: explicit ack per message, a failed
handler nak'ed with a delay, `max_deliver` attempts, then a max-deliveries advisory that
`forward_dead_letters` turns into ``hf.dlq.<subject>``. They are FastStream *batch* pull
subscribers on purpose: a fetched batch is handled in order, one message after the other (the
plain pull subscriber runs a batch's messages concurrently, and an agent must see a task's
`start` before its `stop`, the scheduler a `starting` report before `running`).

`durable_batches` hands the handler the whole fetched batch instead, in order, and takes back
one outcome per message (acked, or nak'ed alone): a hot consumer then decides a batch together
and commits it in one transaction, keeping the order within it.
"""

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

import nats.errors
import structlog
from faststream import Context
from faststream.middlewares import AckPolicy
from faststream.nats import JStream, NatsBroker, NatsRouter, PullSub
from faststream.nats.message import NatsBatchMessage, NatsMessage
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from prometheus_client import Counter
from pydantic import BaseModel, ValidationError

from libs.health import READINESS

from .lanes import LanePool
from .nats import ensure_durable_consumer

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

# How long a batch pull waits for more messages once the first arrived: the latency a quiet
# subject adds per hop, against a fetch round trip per message under load.
BATCH_WINDOW_S = 0.02


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


@dataclass
class Routes:
    """The subscribers of one service (or agent), on a FastStream router."""

    owner: str  # the process, as channel titles show it
    router: NatsRouter = field(default_factory=NatsRouter)
    durables: list[Durable] = field(default_factory=list)
    pools: list[LanePool] = field(default_factory=list)
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
        window_s: float = BATCH_WINDOW_S,
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

        self._subscribe(
            model, each, stream, durable, subject, description, batch, window_s, nak_delay
        )
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
        window_s: float = BATCH_WINDOW_S,
        ack_wait: float = 30.0,
        max_deliver: int = 8,
        nak_delay: float = 1.0,
        deliver_new: bool = False,
        accept: Callable[[str, M], bool] | None = None,
    ) -> None:
        """Like `durable`, but `handle` gets each fetched batch whole, in delivery order, and
        returns one outcome per message: None acks it, an exception naks it alone. `handle`
        raising naks the whole batch. `accept(subject, message)` False: the message is
        logged, counted (`refused`) and terminated, never handled nor redelivered."""

        async def whole(raws: list[Msg], items: list[BaseModel]) -> None:
            if accept is not None:
                raws, items = await _accepted(raws, items, accept, durable)  # type: ignore[arg-type]
            if raws:
                await _handle_batch(raws, items, handle, durable, nak_delay)

        self._subscribe(
            model, whole, stream, durable, subject, description, batch, window_s, nak_delay
        )
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
        window_s: float,
        nak_delay: float,
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
        self.router.subscriber(
            subject,
            stream=JStream(stream, declare=False),
            durable=durable,
            pull_sub=PullSub(batch_size=batch, timeout=window_s, batch=True),
            decoder=decode,
            ack_policy=AckPolicy.MANUAL,
            title=f"{durable}:{subject}",
            description=description,
            inbox_prefix=f"{self.inbox_prefix or '_INBOX'}.".encode(),
        )(consume)

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
        """
        owner = self.owner

        async def receive(message: Any, raw: NatsMessage = Context("message")) -> Any:
            subject = raw.raw_message.subject
            if accept is not None and not accept(subject, message):
                log.warning("core_message_refused", owner=owner, subject=subject)
                HANDLED.labels(f"{owner}:core", "refused").inc()
                return None
            return await handle(message)

        receive.__annotations__["message"] = model
        self.router.subscriber(
            subject,
            queue=queue,
            no_reply=not replies,
            title=f"{self.owner}:{subject}",
            description=description,
        )(receive)

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
    return broker


async def declare(js: JetStreamContext, routes: Sequence[Routes]) -> None:
    """Create or update the durable consumers of `routes` (bounded redelivery, explicit ack)."""
    for r in routes:
        for d in r.durables:
            await ensure_durable_consumer(
                js,
                d.stream,
                d.durable,
                d.subject,
                ack_wait=d.ack_wait,
                max_deliver=d.max_deliver,
                deliver_new=d.deliver_new,
            )


async def serve(nc: Client, routes: Sequence[Routes], stop: asyncio.Event) -> None:
    """Run `routes` on `nc` until `stop` is set."""
    await declare(nc.jetstream(), routes)
    broker = broker_for(nc, routes)
    await broker.start()
    durables = [d.durable for r in routes for d in r.durables]
    for name in durables:
        READINESS.consumer_started(name)  # the process's /readyz waits for these
    try:
        await stop.wait()
    finally:
        for name in durables:
            READINESS.consumer_stopped(name)
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
