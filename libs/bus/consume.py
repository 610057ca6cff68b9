"""A durable, explicit-ack consume loop shared by every service.

Handlers must be idempotent: JetStream redelivers a message whose ack was lost. A handler
that raises gets its message nak'ed with a delay; after `max_deliver` attempts JetStream gives
up and the dead-letter forwarder copies it to `hf.dlq.<subject>` where operators can see it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import nats.errors
import structlog
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from prometheus_client import Counter

from libs.health import READINESS

from .nats import ensure_durable_consumer

log = structlog.get_logger(__name__)

Handler = Callable[[Msg], Awaitable[None]]

HANDLED = Counter(
    "heteroflow_consumer_messages_total",
    "Messages handled by durable consumers",
    ["consumer", "result"],
)
REDELIVERED = Counter(
    "heteroflow_consumer_redeliveries_total", "Messages seen more than once", ["consumer"]
)


async def consume(
    js: JetStreamContext,
    *,
    stream: str,
    durable: str,
    filter_subject: str,
    handler: Handler,
    stop: asyncio.Event,
    batch: int = 256,
    ack_wait: float = 30.0,
    max_deliver: int = 8,
    nak_delay: float = 1.0,
    deliver_new: bool = False,
) -> None:
    await ensure_durable_consumer(
        js,
        stream,
        durable,
        filter_subject,
        ack_wait=ack_wait,
        max_deliver=max_deliver,
        deliver_new=deliver_new,
    )
    sub = await js.pull_subscribe(filter_subject, durable=durable, stream=stream)
    READINESS.consumer_started(durable)  # the process's /readyz waits for this
    try:
        while not stop.is_set():
            try:
                msgs = await sub.fetch(batch, timeout=0.5)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            except Exception:
                log.exception("consumer_fetch_failed", consumer=durable)
                await asyncio.sleep(0.5)
                continue
            for msg in msgs:
                await _handle(msg, handler, durable, nak_delay)
    finally:
        READINESS.consumer_stopped(durable)
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def _handle(msg: Msg, handler: Handler, durable: str, nak_delay: float) -> None:
    if msg.metadata.num_delivered > 1:
        REDELIVERED.labels(durable).inc()
    try:
        await handler(msg)
    except Exception:
        log.exception(
            "consumer_handler_failed",
            consumer=durable,
            subject=msg.subject,
            delivered=msg.metadata.num_delivered,
        )
        HANDLED.labels(durable, "error").inc()
        with contextlib.suppress(Exception):
            await msg.nak(delay=nak_delay)
        return
    HANDLED.labels(durable, "ok").inc()
    with contextlib.suppress(Exception):
        await msg.ack()
