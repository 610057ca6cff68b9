"""Bus declarations, dead letters and leader leases against a real NATS server."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import StreamConfig
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue

from libs.bus import subjects as s
from libs.bus.lease import Lease, open_lease_bucket, run_while_leader
from libs.bus.nats import (
    HDR_DLQ_CONSUMER,
    HDR_DLQ_DELIVERIES,
    connect,
    ensure_durable_consumer,
    ensure_stream,
    ensure_streams,
    forward_dead_letters,
)

pytestmark = pytest.mark.integration

TTL = 1.0


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    client = await connect(nats_url, "test-bus")
    yield client
    await client.close()


@pytest.fixture
def js(nc: Client) -> JetStreamContext:
    return nc.jetstream()


@pytest.fixture
async def kv(js: JetStreamContext) -> AsyncIterator[KeyValue]:
    bucket = "hf_leases_" + uuid.uuid4().hex[:8]
    yield await open_lease_bucket(js, TTL, bucket=bucket)
    await js.delete_key_value(bucket)


def unique(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:10]


async def test_ensure_streams_is_idempotent(js: JetStreamContext) -> None:
    first = await ensure_streams(js)
    second = await ensure_streams(js)
    assert set(first) == set(second) == {s.EVENTS_STREAM, s.NODE_STREAM, s.DLQ_STREAM}
    events = second[s.EVENTS_STREAM].config
    assert events.subjects == list(s.EVENTS_SUBJECTS)
    assert events.duplicate_window == s.DUPLICATE_WINDOW_S
    assert events.max_age == s.EVENTS_MAX_AGE_S
    assert second[s.NODE_STREAM].config.max_age == s.NODE_MAX_AGE_S


async def test_ensure_stream_updates_a_changed_stream(js: JetStreamContext) -> None:
    name = unique("T")
    config = StreamConfig(name=name, subjects=[f"{name}.>"], max_age=60.0)
    await ensure_stream(js, config)
    info = await ensure_stream(js, StreamConfig(name=name, subjects=[f"{name}.>"], max_age=90.0))
    assert info.config.max_age == 90.0
    await js.delete_stream(name)


async def test_ensure_durable_consumer_is_idempotent_and_updates(js: JetStreamContext) -> None:
    await ensure_streams(js)
    durable = unique("c")
    filt = s.event_filter(unique("t"))
    await ensure_durable_consumer(js, s.EVENTS_STREAM, durable, filt, ack_wait=5, max_deliver=3)
    await ensure_durable_consumer(js, s.EVENTS_STREAM, durable, filt, ack_wait=5, max_deliver=3)
    info = await ensure_durable_consumer(js, s.EVENTS_STREAM, durable, filt, 7, 4)
    assert (info.config.max_deliver, info.config.ack_wait) == (4, 7.0)
    assert info.config.filter_subject == filt
    await js.delete_consumer(s.EVENTS_STREAM, durable)


async def test_a_message_past_max_deliver_lands_in_the_dlq(
    nc: Client, js: JetStreamContext
) -> None:
    await ensure_streams(js)
    stream_type = unique("t")
    durable = unique("c")
    subject = s.event_subject(stream_type, "task-1", "poison")
    await ensure_durable_consumer(js, s.EVENTS_STREAM, durable, s.event_filter(stream_type), 5, 2)
    forwarder = await forward_dead_letters(nc, js, s.EVENTS_STREAM, durable)
    await js.publish(subject, b"{}", headers={s.HDR_MSG_ID: str(uuid.uuid4())})

    sub = await js.pull_subscribe_bind(durable, s.EVENTS_STREAM)
    for _ in range(2):
        (msg,) = await sub.fetch(1, timeout=1.0)
        await msg.nak()  # the handler keeps failing
    # The server notices the exhausted message when it next looks for one to deliver.
    with contextlib.suppress(TimeoutError):
        await sub.fetch(1, timeout=0.3)
    dead = None
    for _ in range(40):
        with contextlib.suppress(NotFoundError):
            dead = await js.get_msg(s.DLQ_STREAM, subject=s.dlq_subject(subject))
            break
        await asyncio.sleep(0.05)
    assert dead is not None
    assert dead.data == b"{}"
    assert dead.headers is not None
    assert dead.headers[HDR_DLQ_CONSUMER] == durable
    assert dead.headers[HDR_DLQ_DELIVERIES] == "2"
    await forwarder.unsubscribe()
    await js.delete_consumer(s.EVENTS_STREAM, durable)


async def test_only_one_contender_holds_the_lease(kv: KeyValue) -> None:
    a, b = Lease(kv, "ctl", "a", TTL), Lease(kv, "ctl", "b", TTL)
    assert await a.acquire()
    assert not await b.acquire()
    assert await a.renew()
    assert not await b.acquire()
    assert await b.holder() == "a"
    assert a.held and not b.held
    assert a.revision is not None and a.fencing_token is not None
    assert a.revision > a.fencing_token  # renewals move the CAS revision, not the token


async def test_the_standby_takes_over_after_the_ttl_and_the_stale_holder_loses(
    kv: KeyValue,
) -> None:
    a, b = Lease(kv, "ctl", "a", TTL), Lease(kv, "ctl", "b", TTL)
    assert await a.acquire()
    old_token = a.fencing_token
    assert old_token is not None
    loop = asyncio.get_running_loop()
    started = loop.time()
    for _ in range(100):  # a stopped renewing (paused, partitioned, ...)
        if await b.acquire():
            break
        await asyncio.sleep(0.05)
    assert loop.time() - started >= TTL * 0.5
    assert b.fencing_token is not None and b.fencing_token > old_token
    assert not await a.renew()  # the stale holder finds out, and drops the lease
    assert a.revision is None and not a.held
    assert await b.holder() == "b"


async def test_release_lets_a_standby_in_at_once(kv: KeyValue) -> None:
    a, b = Lease(kv, "ctl", "a", TTL), Lease(kv, "ctl", "b", TTL)
    assert await a.acquire()
    await a.release()
    assert await b.acquire()
    await a.release()  # not held: nothing to do
    assert await b.holder() == "b"


async def test_run_while_leader_runs_one_body_at_a_time(kv: KeyValue) -> None:
    running: list[str] = []
    tokens: list[int] = []
    overlap = False

    def body(who: str) -> Callable[[int], Coroutine[Any, Any, None]]:
        async def run(token: int) -> None:
            nonlocal overlap
            overlap = overlap or bool(running)
            running.append(who)
            tokens.append(token)
            try:
                await asyncio.Event().wait()
            finally:
                running.remove(who)

        return run

    stops = {who: asyncio.Event() for who in "ab"}
    tasks = {
        who: asyncio.create_task(
            run_while_leader(
                Lease(kv, "ctl", who, TTL), body(who), stops[who], renew_every=0.2, retry_every=0.05
            )
        )
        for who in "ab"
    }
    for _ in range(100):  # until one of them leads (5 s deadline)
        if running:
            break
        await asyncio.sleep(0.05)
    assert len(running) == 1
    leader = running[0]
    stops[leader].set()  # the leader steps down and releases
    await asyncio.wait_for(tasks[leader], 2.0)
    for _ in range(40):
        if running:
            break
        await asyncio.sleep(0.05)
    assert running == [("b" if leader == "a" else "a")]
    assert not overlap
    assert tokens == sorted(tokens) and len(set(tokens)) == 2
    for who in "ab":
        stops[who].set()
    await asyncio.wait_for(asyncio.gather(*tasks.values()), 2.0)
