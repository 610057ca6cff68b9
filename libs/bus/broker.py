"""Typed subscribers for every subject, declared through FastStream and served by the platform.

A process declares what it consumes as `Routes`: durable JetStream consumers (`durable`) and
core NATS subscriptions (`core`), each taking a pydantic message model. The declarations live
on FastStream routers, and the models are what the AsyncAPI document is generated from
(`heteroflow/asyncapi.py`), so a subject cannot be consumed without being documented; that is
all FastStream does here (`broker_for` is never started). `serve` runs the routes on the
process's existing client with nats-py's public API: durable consumers through the platform's
own pull loop (`libs/bus/pull.py`), core subscriptions as plain subscriptions (see `core`).

Durable consumers keep the platform's delivery contract: explicit ack per message, a failed
handler nak'ed with a delay, `max_deliver` attempts, then a max-deliveries advisory that the
dead-letter forwarder `serve` starts beside them (`forward_dead_letters`) turns into
``hf.dlq.<subject>``. A fetched batch is handled in order, one message after the other (an
agent must see a task's `start` before its `stop`, the scheduler a `starting` report before
`running`), unless the consumer declares lanes (`libs/bus/lanes.py`).

`durable_batches` hands the handler the whole fetched batch instead, in order, and takes back
one outcome per message (acked, or nak'ed alone): a hot consumer then decides a batch together
and commits it in one transaction, keeping the order within it. A pipelined one also fetches
and starts the next batch while the previous one commits, once the store has marked the
previous one's writes locked in place (`libs/ordering.py`), so two reports of one task that
land in consecutive batches are one commit apart, not a commit, an ack and two fetches.
"""

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog
from faststream.middlewares import AckPolicy
from faststream.nats import JStream, NatsBroker, NatsRouter, PullSub
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from prometheus_client import Counter
from pydantic import BaseModel, ValidationError

from libs.health import READINESS

from .lanes import LanePool
from .nats import ensure_durable_consumer, forward_dead_letters, when_jetstream_answers
from .pull import IDLE_FETCH_S, PullLoop

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
class Pull:
    """How `serve` pulls one durable: its batches go to `consume` (libs/bus/pull.py)."""

    stream: str
    durable: str
    consume: Callable[[list[Msg]], Coroutine[Any, Any, None]]
    batch: int
    pipelined: bool


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
    # under its own prefix (libs/bus/permissions.py); None: `_INBOX.`. Routes that set one
    # belong to a user confined to its own subjects, which runs no dead-letter forwarder.
    inbox_prefix: str | None = None
    # The pull of each durable, as `serve` runs it.
    pulls: list[Pull] = field(default_factory=list)

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

        self._subscribe(
            model, whole, stream, durable, subject, description, batch, nak_delay, pipelined
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
        nak_delay: float,
        pipelined: bool = False,
    ) -> None:
        """Document `durable`'s channel through FastStream and keep its pull for `serve`."""

        async def consume(messages: list[Msg]) -> None:
            # Validated one by one, so one bad body does not take its batch down with it.
            raws: list[Msg] = []
            items: list[BaseModel] = []
            for raw in messages:
                try:
                    items.append(model.model_validate_json(raw.data))
                except ValidationError:
                    log.exception("consumer_bad_message", consumer=durable, subject=raw.subject)
                    HANDLED.labels(durable, "error").inc()
                    with contextlib.suppress(Exception):
                        await raw.nak(delay=nak_delay)
                    continue
                raws.append(raw)
            if raws:
                await run(raws, items)

        async def documented(batch: list[Any]) -> None:
            """Never called: the model in its annotation is what FastStream documents."""

        documented.__annotations__["batch"] = list[model]  # type: ignore[valid-type]
        self.router.subscriber(
            subject,
            stream=JStream(stream, declare=False),
            durable=durable,
            pull_sub=PullSub(batch_size=batch, timeout=IDLE_FETCH_S, batch=True),
            ack_policy=AckPolicy.MANUAL,
            title=f"{durable}:{subject}",
            description=description,
        )(documented)
        self.pulls.append(Pull(stream, durable, consume, batch, pipelined))

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


def broker_for(nc: None, routes: Sequence[Routes]) -> NatsBroker:
    """An unconnected FastStream broker declaring `routes`: what the AsyncAPI document is
    generated from. It is never started (`serve` runs the routes itself)."""
    # FastStream's per-message logging would double ours and cost a log line per message.
    broker = NatsBroker(logger=None, apply_types=True)
    for r in routes:
        broker.include_router(r.router)
        broker.include_router(r.documented)
    return broker


def _declarer(js: JetStreamContext, d: Durable) -> Callable[[], Awaitable[Any]]:
    """The create-or-update of durable `d`: run at start, and again by its `PullLoop` when
    the server says the consumer does not exist (a lost JetStream store, a deleted consumer)."""
    return functools.partial(
        ensure_durable_consumer,
        js,
        d.stream,
        d.durable,
        d.subject,
        ack_wait=d.ack_wait,
        max_deliver=d.max_deliver,
        deliver_new=d.deliver_new,
    )


async def declare(js: JetStreamContext, routes: Sequence[Routes]) -> None:
    """Create or update the durable consumers of `routes` (bounded redelivery, explicit ack)."""
    for r in routes:
        for d in r.durables:
            await when_jetstream_answers(f"consumer {d.durable}", _declarer(js, d))


async def serve(
    nc: Client,
    routes: Sequence[Routes],
    stop: asyncio.Event,
    *,
    dead_letters: bool | None = None,
) -> None:
    """Run `routes` on `nc` until `stop` is set.

    With durable consumers, the process also forwards dead letters (`forward_dead_letters`:
    every consumer's max-deliveries advisories, in one queue group across processes).
    `dead_letters` None: unless a route confines its inboxes (an agent, whose NATS user may
    not subscribe to advisories; the services' forwarders cover its consumer).
    """
    js = nc.jetstream()
    await declare(js, routes)
    declarers = {d.durable: _declarer(js, d) for r in routes for d in r.durables}
    subs = [
        await nc.subscribe(c.subject, queue=c.queue, cb=c.callback())
        for r in routes
        for c in r.cores
    ]
    loops = [
        PullLoop(
            nc,
            p.stream,
            p.durable,
            p.consume,
            batch=p.batch,
            pipelined=p.pipelined,
            inbox_prefix=r.inbox_prefix,
            redeclare=declarers.get(p.durable),
        )
        for r in routes
        for p in r.pulls
    ]
    for loop in loops:
        await loop.open()
    if dead_letters is None:
        dead_letters = all(r.inbox_prefix is None for r in routes)
    if dead_letters and loops:
        subs.append(await forward_dead_letters(nc, js))
    tasks = [asyncio.create_task(loop.run(), name=f"pull-{loop.durable}") for loop in loops]
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
        for loop, task in zip(loops, tasks, strict=True):
            loop.stop(task)
        # A pipelined loop waits for its running batches; a plain one's batch is cancelled.
        await asyncio.gather(*tasks, return_exceptions=True)
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
