"""NATS plumbing shared by every process: connect, declare streams and durable consumers,
and park poison messages where an operator can see them.

Declarations are idempotent so that every replica can run them on start: a stream or consumer
that exists is brought to the declared configuration instead of failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerInfo,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamInfo,
)
from nats.js.errors import (
    BadRequestError,
    NoStreamResponseError,
    NotFoundError,
    ServiceUnavailableError,
)

from libs.config import CommonSettings

from . import subjects as s

log = structlog.get_logger(__name__)

# JetStream's "stream name already in use with a different configuration".
_STREAM_NAME_IN_USE = 10058

T = TypeVar("T")

# What a JetStream call gets while the cluster has no meta leader yet (a fresh start) or is
# electing one (a server just died): no answer, no responder, 503, or (a publish) no stream
# leader to answer. Not refusals.
NOT_READY = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    ServiceUnavailableError,
    NoStreamResponseError,
)
JETSTREAM_WAIT_S = 120.0


async def when_jetstream_answers(
    what: str, call: Callable[[], Awaitable[T]], wait_s: float = JETSTREAM_WAIT_S
) -> T:
    """`call()`, tried again while JetStream is not ready, for up to `wait_s` seconds.

    A service started beside its NATS cluster (compose, Kubernetes) comes up before the
    servers have elected a meta leader, and one started while a server dies meets the
    election: it waits, as a pod waits for its dependency, instead of exiting and being
    restarted. Any other error, or the last one after `wait_s`, is raised.
    """
    deadline = time.monotonic() + wait_s
    delay = 0.25
    attempt = 1
    while True:
        try:
            return await call()
        except NOT_READY as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("jetstream_not_ready", what=what, attempt=attempt, error=repr(exc))
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)
        attempt += 1


# Headers added to a dead-lettered message, so it says where and why it died.
HDR_DLQ_STREAM = "Hf-Dlq-Stream"
HDR_DLQ_CONSUMER = "Hf-Dlq-Consumer"
HDR_DLQ_STREAM_SEQ = "Hf-Dlq-Stream-Seq"
HDR_DLQ_DELIVERIES = "Hf-Dlq-Deliveries"
HDR_DLQ_SUBJECT = "Hf-Dlq-Subject"


async def connect(
    url: str,
    name: str,
    *,
    connect_timeout: float = 5.0,
    give_up_after: float = 60.0,
    user: str | None = None,
    password: str | None = None,
    inbox_prefix: str | None = None,
) -> Client:
    """A client that reconnects forever.

    `url` may list several servers separated by commas. With unbounded reconnects nats-py also
    retries the first connect without end (services may start before the server does); that
    first connect is bounded by `give_up_after` seconds so a wrong URL fails the start.
    `user`/`password` log in when the URL carries no credentials; `inbox_prefix` is the
    prefix of this client's reply inboxes (an agent may subscribe only under its own).
    """
    login: dict[str, str] = {}
    if user is not None and password is not None:
        login = {"user": user, "password": password}
    if inbox_prefix is not None:
        login["inbox_prefix"] = inbox_prefix

    async def on_error(exc: Exception) -> None:
        log.warning("nats_error", client=name, error=str(exc))

    async def on_disconnected() -> None:
        # Also called on a deliberate close, hence not a warning.
        log.info("nats_disconnected", client=name)

    async def on_reconnected() -> None:
        log.info("nats_reconnected", client=name)

    return await asyncio.wait_for(
        nats.connect(
            servers=[u.strip() for u in url.split(",") if u.strip()],
            name=name,
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            reconnect_time_wait=1,
            connect_timeout=int(max(1, connect_timeout)),
            # Detect a dead peer within ~1 minute instead of nats-py's default 4.
            ping_interval=20,
            max_outstanding_pings=3,
            error_cb=on_error,
            disconnected_cb=on_disconnected,
            reconnected_cb=on_reconnected,
            **login,
        ),
        give_up_after,
    )


def configured_replicas() -> int:
    """HETEROFLOW_NATS_REPLICAS. Read by every process that declares streams (up, services,
    agents, CLIs) so none of them "corrects" an R3 stream back to R1."""
    return CommonSettings().nats_replicas


def stream_configs(
    *,
    events_max_age: float = s.EVENTS_MAX_AGE_S,
    node_max_age: float = s.NODE_MAX_AGE_S,
    dlq_max_age: float = s.DLQ_MAX_AGE_S,
    replicas: int | None = None,
) -> list[StreamConfig]:
    """The platform's streams: events, node traffic, dead letters; `replicas` None = the
    configured HETEROFLOW_NATS_REPLICAS."""
    replicas = replicas or configured_replicas()

    def cfg(name: str, subjects: tuple[str, ...], max_age: float, description: str) -> StreamConfig:
        return StreamConfig(
            name=name,
            description=description,
            subjects=list(subjects),
            storage=StorageType.FILE,
            retention=RetentionPolicy.LIMITS,
            discard=DiscardPolicy.OLD,
            max_age=max_age,
            duplicate_window=s.DUPLICATE_WINDOW_S,
            num_replicas=replicas,
        )

    return [
        cfg(s.EVENTS_STREAM, s.EVENTS_SUBJECTS, events_max_age, "committed domain events"),
        cfg(s.NODE_STREAM, s.NODE_SUBJECTS, node_max_age, "node commands and reports"),
        cfg(s.DLQ_STREAM, s.DLQ_SUBJECTS, dlq_max_age, "messages that exhausted max_deliver"),
    ]


async def ensure_stream(js: JetStreamContext, config: StreamConfig) -> StreamInfo:
    """Create `config`'s stream, or update it to `config` when it exists with another one.

    A stream that already has `config` is left alone without a write, so a service whose NATS
    user may not administer streams passes here once `up` (or an operator) declared them.
    """
    with contextlib.suppress(NotFoundError):
        info = await js.stream_info(config.name or "")
        if _same(info.config, config):
            return info
    try:
        return await js.add_stream(config)
    except BadRequestError as exc:
        if exc.err_code != _STREAM_NAME_IN_USE:
            raise
    return await js.update_stream(config)


def _same(have: StreamConfig, want: StreamConfig) -> bool:
    fields = ("subjects", "storage", "retention", "discard", "max_age", "duplicate_window")
    return all(getattr(have, f) == getattr(want, f) for f in fields) and (
        (have.num_replicas or 1) == (want.num_replicas or 1)
    )


async def ensure_streams(
    js: JetStreamContext,
    *,
    events_max_age: float = s.EVENTS_MAX_AGE_S,
    node_max_age: float = s.NODE_MAX_AGE_S,
    dlq_max_age: float = s.DLQ_MAX_AGE_S,
    replicas: int | None = None,
) -> dict[str, StreamInfo]:
    """Declare every platform stream; safe to run from every replica on every start."""
    infos: dict[str, StreamInfo] = {}
    configs = stream_configs(
        events_max_age=events_max_age,
        node_max_age=node_max_age,
        dlq_max_age=dlq_max_age,
        replicas=replicas,
    )
    for config in configs:
        info = await when_jetstream_answers(
            f"stream {config.name}", functools.partial(ensure_stream, js, config)
        )
        infos[info.config.name or ""] = info
    return infos


async def ensure_durable_consumer(
    js: JetStreamContext,
    stream: str,
    durable: str,
    filter_subject: str,
    ack_wait: float = 30.0,
    max_deliver: int = 5,
    *,
    max_ack_pending: int = 1000,
    deliver_new: bool = False,
) -> ConsumerInfo:
    """A durable pull consumer with explicit acks and bounded redelivery.

    `deliver_new`: a consumer created now starts at the stream's end (no history replay);
    it is fixed at creation, as JetStream does not change a durable's start.

    Idempotent: the durable-create API creates or updates, so a changed `ack_wait` or
    `max_deliver` is applied to the existing consumer. A message delivered `max_deliver`
    times without an ack stops being redelivered; JetStream then emits a max-deliveries
    advisory, which `forward_dead_letters` turns into a message on ``hf.dlq.<subject>``.
    """
    return await js.add_consumer(
        stream,
        # With a name the create subject carries the filter
        # ($JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>), which is what lets an agent's
        # NATS user create its own consumer and no consumer on another node's commands.
        name=durable,
        durable_name=durable,
        filter_subject=filter_subject,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.NEW if deliver_new else DeliverPolicy.ALL,
        ack_wait=ack_wait,
        max_deliver=max_deliver,
        max_ack_pending=max_ack_pending,
    )


async def dead_letter(js: JetStreamContext, advisory: dict[str, object]) -> str | None:
    """Copy the message named by a max-deliveries advisory to ``hf.dlq.<subject>``.

    Returns the DLQ subject, or None when the original is gone (aged out or deleted).
    """
    stream = str(advisory["stream"])
    consumer = str(advisory["consumer"])
    seq = int(str(advisory["stream_seq"]))
    try:
        original = await js.get_msg(stream, seq)
    except NotFoundError:
        log.warning("dlq_original_missing", stream=stream, consumer=consumer, stream_seq=seq)
        return None
    subject = s.dlq_subject(original.subject or "")
    headers = dict(original.headers or {})
    headers.update(
        {
            # Per (stream, consumer, seq): two consumers failing one message give two entries,
            # while two forwarders handling the same advisory give one.
            s.HDR_MSG_ID: f"{stream}:{consumer}:{seq}",
            HDR_DLQ_STREAM: stream,
            HDR_DLQ_CONSUMER: consumer,
            HDR_DLQ_STREAM_SEQ: str(seq),
            HDR_DLQ_DELIVERIES: str(advisory.get("deliveries", "")),
            HDR_DLQ_SUBJECT: original.subject or "",
        }
    )
    await js.publish(subject, original.data or b"", headers=headers)
    log.warning("dead_lettered", stream=stream, consumer=consumer, stream_seq=seq, dlq=subject)
    return subject


# The forwarders of every process share one queue group: an advisory reaches one of them.
DLQ_QUEUE = "hf-dead-letters"


async def forward_dead_letters(
    nc: Client,
    js: JetStreamContext,
    stream: str = "*",
    consumer: str = "*",
    *,
    queue: str = DLQ_QUEUE,
) -> Subscription:
    """Subscribe to max-deliveries advisories and dead-letter each message they name.

    JetStream emits the advisory when it next looks for a message to deliver to that
    consumer (a pull is waiting) and finds this one exhausted. Advisories are plain NATS
    messages: one emitted while no forwarder runs is not seen, so `libs/bus/broker.serve`
    runs one in every process that serves durable consumers, for every stream and consumer.
    The forwarders share the queue group `queue`, so one advisory is handled once; should two
    handle it anyway (a forwarder outside the group), the copies collapse in HF_DLQ by their
    `Nats-Msg-Id`. Agents run none: their NATS users may subscribe only to their own subjects
    (libs/bus/permissions.py), and the services' forwarders see the advisories of the agents'
    consumers too. A service user needs to subscribe to
    ``$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>``, read the stream's messages
    (``$JS.API.STREAM.MSG.GET.>``) and publish ``hf.dlq.>``: none of them is denied.
    """

    async def on_advisory(msg: Msg) -> None:
        try:
            await dead_letter(js, json.loads(msg.data))
        except Exception:  # a bad advisory must not kill the subscription
            log.exception("dlq_forward_failed", advisory=msg.data.decode(errors="replace"))

    return await nc.subscribe(
        s.max_deliveries_advisory(stream, consumer), queue=queue, cb=on_advisory
    )
