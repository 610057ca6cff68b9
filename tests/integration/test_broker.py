"""Subscribers as the platform declares and serves them (libs/bus/broker.py, libs/bus/pull.py),
against a real NATS server: typed messages, order within a batch, nak-and-retry, bad bodies,
core replies, eager fetches, pipelined batches, lanes and dead letters."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import StreamConfig
from nats.js.errors import NotFoundError
from pydantic import BaseModel

from libs import ordering
from libs.bus import pull
from libs.bus import subjects as s
from libs.bus.broker import Routes, serve
from libs.bus.nats import HDR_DLQ_CONSUMER, connect, ensure_stream, ensure_streams
from tests.wait import wait_until_async

pytestmark = pytest.mark.integration

DEADLINE_S = 20.0


class Item(BaseModel):
    n: int


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    client = await connect(nats_url, "test-broker")
    yield client
    await client.close()


async def test_durable_handles_in_order_naks_failures_and_skips_bad_bodies(nc: Client) -> None:
    tag = uuid.uuid4().hex[:8]
    stream, prefix = f"T{tag}", f"t{tag}"
    js = nc.jetstream()
    await ensure_stream(js, StreamConfig(name=stream, subjects=[f"{prefix}.>"]))
    seen: list[int] = []
    failed: list[int] = []

    async def handle(item: Item) -> None:
        if item.n == 7 and not failed:
            failed.append(item.n)
            raise RuntimeError("first delivery fails")
        seen.append(item.n)

    routes = Routes("test")
    routes.durable(
        Item,
        handle,
        stream=stream,
        durable=f"d{tag}",
        subject=f"{prefix}.{{key}}.item",
        description="test",
        nak_delay=0.2,
    )
    stop = asyncio.Event()
    server = asyncio.create_task(serve(nc, [routes], stop))
    try:
        for i in range(300):
            if i == 100:
                await js.publish(f"{prefix}.k.item", b"not an item")
            await js.publish(f"{prefix}.k{i % 3}.item", Item(n=i).model_dump_json().encode())
        await wait_until_async(
            lambda: 7 in seen and len(seen) == 300, DEADLINE_S, 0.02, "every item"
        )
        assert [n for n in seen if n != 7] == [n for n in range(300) if n != 7]
        assert failed == [7] and seen.index(7) > 7  # retried after the nak, not lost
        # The bad body, nak'ed, waiting for its redelivery. The handled items' acks are sent
        # after their handler returned, so the last of them may still be on their way.

        async def only_the_bad_body() -> bool:
            info = await js.consumer_info(stream, f"d{tag}")
            return bool(info.num_ack_pending == 1)

        await wait_until_async(only_the_bad_body, DEADLINE_S, 0.02, "only the bad body unacked")
    finally:
        stop.set()
        await server
        await js.delete_stream(stream)
    assert nc.is_connected  # the broker ran on the process's client and left it open


async def test_core_subscriber_answers_a_request_with_its_model(nc: Client) -> None:
    subject = f"c{uuid.uuid4().hex[:8]}.{{node}}.ask"

    async def double(item: Item) -> Item:
        return Item(n=item.n * 2)

    routes = Routes("test")
    routes.core(Item, double, subject=subject, description="test", replies=True)
    stop = asyncio.Event()
    server = asyncio.create_task(serve(nc, [routes], stop))
    try:
        concrete = subject.replace("{node}", "n1")
        end = time.monotonic() + DEADLINE_S
        while True:
            try:
                reply = await nc.request(concrete, Item(n=21).model_dump_json().encode(), 0.5)
                break
            except Exception:
                assert time.monotonic() < end, "no reply"
        assert Item.model_validate_json(reply.data).n == 42
    finally:
        stop.set()
        await server


async def test_a_listener_on_a_stream_subject_leaves_the_publish_ack_alone(nc: Client) -> None:
    """A core subscriber on a JetStream subject sees the publish's ack inbox as its reply
    subject; unless it is declared to reply, it must not answer there."""
    tag = uuid.uuid4().hex[:8]
    stream, prefix = f"L{tag}", f"l{tag}"
    js = nc.jetstream()
    await ensure_stream(js, StreamConfig(name=stream, subjects=[f"{prefix}.>"]))
    heard: list[int] = []

    async def listen(item: Item) -> None:
        heard.append(item.n)

    routes = Routes("test")
    routes.core(Item, listen, subject=f"{prefix}.{{key}}", description="test")
    stop = asyncio.Event()
    server = asyncio.create_task(serve(nc, [routes], stop))
    try:
        await wait_until_async(
            lambda: server.done() or _subscribed(nc, prefix), DEADLINE_S, 0.02, "the subscription"
        )
        for i in range(50):
            ack = await js.publish(f"{prefix}.k", Item(n=i).model_dump_json().encode())
            assert ack.stream == stream and ack.seq == i + 1
        await wait_until_async(lambda: len(heard) == 50, DEADLINE_S, 0.02, "every message heard")
    finally:
        stop.set()
        await server
        await js.delete_stream(stream)


def _subscribed(nc: Client, prefix: str) -> bool:
    return any(sub.subject.startswith(prefix) for sub in nc._subs.values())


async def _pipelined_consumer(
    nc: Client, handle: object
) -> tuple[str, asyncio.Event, asyncio.Task[None]]:
    tag = uuid.uuid4().hex[:8]
    stream, prefix = f"P{tag}", f"p{tag}"
    await ensure_stream(nc.jetstream(), StreamConfig(name=stream, subjects=[f"{prefix}.>"]))
    routes = Routes("test")
    routes.durable_batches(
        Item,
        handle,  # type: ignore[arg-type]
        stream=stream,
        durable=f"d{tag}",
        subject=f"{prefix}.{{key}}.item",
        description="test",
        pipelined=True,
    )
    stop = asyncio.Event()
    return prefix, stop, asyncio.create_task(serve(nc, [routes], stop))


async def test_a_pipelined_consumer_starts_the_next_batch_once_the_last_is_ordered(
    nc: Client,
) -> None:
    """The first batch marks itself ordered and then holds (as a commit would): the second
    batch is fetched and started meanwhile; both are acknowledged in the end."""
    gate, second_started = asyncio.Event(), asyncio.Event()
    seen: list[int] = []

    async def handle(items: list[Item]) -> list[None]:
        seen.extend(i.n for i in items)
        if items[0].n == 0:
            ordering.mark_ordered()
            await gate.wait()
        else:
            second_started.set()
        return [None] * len(items)

    prefix, stop, server = await _pipelined_consumer(nc, handle)
    js = nc.jetstream()
    try:
        await js.publish(f"{prefix}.k.item", Item(n=0).model_dump_json().encode())
        await wait_until_async(lambda: seen == [0], DEADLINE_S, 0.02, "the first batch")
        await js.publish(f"{prefix}.k.item", Item(n=1).model_dump_json().encode())
        await asyncio.wait_for(second_started.wait(), DEADLINE_S)
        assert not gate.is_set()  # the first batch is still holding
        gate.set()
        stream = f"P{prefix[1:]}"
        end = time.monotonic() + DEADLINE_S
        while (info := await js.consumer_info(stream, f"d{prefix[1:]}")).num_ack_pending:
            assert time.monotonic() < end, "both batches acknowledged"
            await asyncio.sleep(0.05)
        assert info.num_pending == 0 and seen == [0, 1]
    finally:
        gate.set()
        stop.set()
        await server


async def test_a_batch_that_is_not_ordered_holds_back_the_next(nc: Client) -> None:
    """A handler that runs several transactions (`unordered`) keeps the batches one after the
    other: the second does not start while the first holds."""
    gate = asyncio.Event()
    events: list[str] = []
    second_started = asyncio.Event()

    async def handle(items: list[Item]) -> list[None]:
        events.append(f"start {items[0].n}")
        if items[0].n == 0:
            ordering.unordered()
            ordering.mark_ordered()  # ignored: this batch said it is not ordered
            await gate.wait()
        else:
            second_started.set()
        events.append(f"end {items[0].n}")
        return [None] * len(items)

    prefix, stop, server = await _pipelined_consumer(nc, handle)
    js = nc.jetstream()
    try:
        await js.publish(f"{prefix}.k.item", Item(n=0).model_dump_json().encode())
        await wait_until_async(lambda: events == ["start 0"], DEADLINE_S, 0.02, "the first batch")
        await js.publish(f"{prefix}.k.item", Item(n=1).model_dump_json().encode())
        # A pipelined start would come within milliseconds; a second is a wide margin.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(second_started.wait()), 1.0)
        gate.set()
        await asyncio.wait_for(second_started.wait(), DEADLINE_S)
        await wait_until_async(lambda: len(events) == 4, DEADLINE_S, 0.02, "the second batch's end")
        assert events == ["start 0", "end 0", "start 1", "end 1"]
    finally:
        gate.set()
        stop.set()
        await server


async def test_a_pipelined_consumer_fetches_the_next_batch_before_the_last_is_ordered(
    nc: Client,
) -> None:
    """While the first batch has not yet taken its locks (not ordered), a message published
    meanwhile is already fetched (delivered, unacknowledged), but its batch does not start
    until the first is ordered."""
    gate, second_started = asyncio.Event(), asyncio.Event()

    async def handle(items: list[Item]) -> list[None]:
        if items[0].n == 0:
            await gate.wait()  # still before its locks
            ordering.mark_ordered()
        else:
            second_started.set()
        return [None] * len(items)

    prefix, stop, server = await _pipelined_consumer(nc, handle)
    js = nc.jetstream()
    stream, durable = f"P{prefix[1:]}", f"d{prefix[1:]}"
    try:
        await js.publish(f"{prefix}.k.item", Item(n=0).model_dump_json().encode())
        await _until_acked_pending(js, stream, durable, 1)
        await js.publish(f"{prefix}.k.item", Item(n=1).model_dump_json().encode())
        await _until_acked_pending(js, stream, durable, 2)  # fetched ahead
        assert not second_started.is_set()
        gate.set()
        await asyncio.wait_for(second_started.wait(), DEADLINE_S)
    finally:
        gate.set()
        stop.set()
        await server


async def _until_acked_pending(
    js: JetStreamContext, stream: str, durable: str, n: int, *, at_most: bool = False
) -> None:
    """Until `n` (at least, or `at_most`) messages are delivered and not yet acknowledged."""
    end = time.monotonic() + DEADLINE_S
    while True:
        try:
            pending: int | None = (await js.consumer_info(stream, durable)).num_ack_pending
        except NotFoundError:  # the consumer's task has not declared it yet
            pending = None
        if pending is not None and ((pending <= n) if at_most else (pending >= n)):
            return
        assert time.monotonic() < end, f"{n} messages delivered to the consumer, not {pending}"
        await asyncio.sleep(0.02)


async def test_an_eager_fetch_takes_what_is_held_at_once_and_waits_for_nothing_more(
    nc: Client,
) -> None:
    """What the server holds when a fetch starts comes as one batch (up to the batch size);
    a message arriving alone is handed over at once, not after the pull's idle window."""
    batches: list[list[int]] = []
    handled: dict[int, float] = {}

    async def handle(items: list[Item]) -> list[None]:
        batches.append([i.n for i in items])
        handled.update((i.n, time.monotonic()) for i in items)
        return [None] * len(items)

    js = nc.jetstream()
    tag = uuid.uuid4().hex[:8]
    stream, prefix = f"E{tag}", f"e{tag}"
    await ensure_stream(js, StreamConfig(name=stream, subjects=[f"{prefix}.>"]))
    for i in range(50):  # held before the consumer exists
        await js.publish(f"{prefix}.k.item", Item(n=i).model_dump_json().encode())
    routes = Routes("test")
    routes.durable_batches(
        Item,
        handle,
        stream=stream,
        durable=f"d{tag}",
        subject=f"{prefix}.{{key}}.item",
        description="test",
        batch=20,
    )
    stop = asyncio.Event()
    server = asyncio.create_task(serve(nc, [routes], stop))
    try:
        await wait_until_async(lambda: len(handled) == 50, DEADLINE_S, 0.02, "the held messages")
        assert batches == [list(range(0, 20)), list(range(20, 40)), list(range(40, 50))]
        sent = time.monotonic()
        await js.publish(f"{prefix}.k.item", Item(n=50).model_dump_json().encode())
        await wait_until_async(lambda: 50 in handled, DEADLINE_S, 0.02, "the lone message")
        assert batches[-1] == [50]
        assert handled[50] - sent < pull.IDLE_FETCH_S / 2  # not held for the idle window
    finally:
        stop.set()
        await server
        await js.delete_stream(stream)


async def test_lanes_keep_the_order_of_a_key_and_run_keys_side_by_side(nc: Client) -> None:
    """With `lane`, one key's messages are handled in order while a held key does not hold
    up the others; every message is acknowledged once its handler returns."""
    tag = uuid.uuid4().hex[:8]
    stream, prefix = f"N{tag}", f"n{tag}"
    js = nc.jetstream()
    await ensure_stream(js, StreamConfig(name=stream, subjects=[f"{prefix}.>"]))
    gate = asyncio.Event()
    seen: dict[str, list[int]] = {"a": [], "b": []}

    async def handle(item: Item) -> None:
        key = "a" if item.n % 2 == 0 else "b"
        if item.n == 0:
            await gate.wait()  # key a's first message holds its lane
        seen[key].append(item.n)

    routes = Routes("test")
    routes.durable(
        Item,
        handle,
        stream=stream,
        durable=f"d{tag}",
        subject=f"{prefix}.{{key}}.item",
        description="test",
        lane=lambda item: "a" if item.n % 2 == 0 else "b",
        max_in_flight=64,
    )
    stop = asyncio.Event()
    server = asyncio.create_task(serve(nc, [routes], stop))
    try:
        for i in range(20):
            await js.publish(f"{prefix}.k.item", Item(n=i).model_dump_json().encode())
        await wait_until_async(
            lambda: len(seen["b"]) == 10, DEADLINE_S, 0.02, "key b while key a is held"
        )
        assert seen["a"] == [] and seen["b"] == list(range(1, 20, 2))
        gate.set()
        await wait_until_async(
            lambda: len(seen["a"]) == 10, DEADLINE_S, 0.02, "key a once released"
        )
        assert seen["a"] == list(range(0, 20, 2))
        await _until_acked_pending(js, stream, f"d{tag}", 0, at_most=True)
    finally:
        gate.set()
        stop.set()
        await server
        await js.delete_stream(stream)


async def test_serve_dead_letters_a_message_past_max_deliver_once_across_processes(
    nats_url: str,
) -> None:
    """Every process that serves durable consumers forwards dead letters: a message whose
    handler keeps failing lands in HF_DLQ once, though two processes forward advisories."""
    clients = [await connect(nats_url, f"test-dlq-{i}") for i in range(2)]
    js = clients[0].jetstream()
    await ensure_streams(js)
    tag = uuid.uuid4().hex[:8]
    stream_type = f"t{tag}"
    subject = s.event_subject(stream_type, "x1", "poison")
    tries: list[int] = []

    async def fail(item: Item) -> None:
        tries.append(item.n)
        raise RuntimeError("always")

    routes = Routes("test")
    routes.durable(
        Item,
        fail,
        stream=s.EVENTS_STREAM,
        durable=f"d{tag}",
        subject=s.event_filter(stream_type),
        description="test",
        max_deliver=3,
        nak_delay=0.05,
    )
    other = Routes("other")  # a second process's consumer, on another subject
    other.durable(
        Item,
        fail,
        stream=s.EVENTS_STREAM,
        durable=f"o{tag}",
        subject=s.event_filter(f"o{tag}"),
        description="test",
    )
    stop = asyncio.Event()
    servers = [
        asyncio.create_task(serve(clients[0], [routes], stop)),
        asyncio.create_task(serve(clients[1], [other], stop)),
    ]
    try:
        await js.publish(subject, Item(n=1).model_dump_json().encode())
        dlq = s.dlq_subject(subject)
        end = time.monotonic() + DEADLINE_S
        while True:
            try:
                dead = await js.get_msg(s.DLQ_STREAM, subject=dlq)
                break
            except NotFoundError:
                assert time.monotonic() < end, f"nothing on {dlq}"
                await asyncio.sleep(0.05)
        assert tries == [1, 1, 1]
        assert dead.headers is not None and dead.headers[HDR_DLQ_CONSUMER] == f"d{tag}"
        assert Item.model_validate_json(dead.data or b"").n == 1
        # Both forwarders got the chance: the DLQ holds one copy.
        dl = await js.stream_info(s.DLQ_STREAM, subjects_filter=dlq)
        assert dl.state.subjects == {dlq: 1}
    finally:
        stop.set()
        await asyncio.gather(*servers)
        for c in clients:
            await c.close()
