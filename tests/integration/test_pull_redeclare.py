"""A durable consumer the server no longer has (deleted, or lost with its stream and the
JetStream store) is declared again by its `PullLoop`, which then consumes again: a process
that stayed connected needs nobody to restart it. Against a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import uuid
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import StreamConfig

from libs.bus.nats import connect, ensure_durable_consumer
from libs.bus.pull import PullLoop
from tests.wait import wait_until_async

pytestmark = pytest.mark.integration


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    client = await connect(nats_url, "test-pull-redeclare")
    yield client
    await client.close()


async def test_a_pull_loop_declares_its_consumer_again_when_the_server_has_none(
    nc: Client,
) -> None:
    js = nc.jetstream()
    tag = uuid.uuid4().hex[:8]
    stream, durable, subject = f"T_{tag}", f"d_{tag}", f"t.{tag}.x"
    config = StreamConfig(name=stream, subjects=[f"t.{tag}.>"])
    await js.add_stream(config)
    declare = functools.partial(ensure_durable_consumer, js, stream, durable, subject)
    await declare()
    declared: list[str] = []  # what each declaring by the loop came to
    errors: list[str] = []

    async def declare_again() -> None:
        try:
            await declare()
        except Exception as exc:
            declared.append("failed")
            errors.append(repr(exc))
            raise
        declared.append("ok")

    got: list[bytes] = []

    async def consume(messages: list[Msg]) -> None:
        for msg in messages:
            got.append(msg.data)
            await msg.ack()

    loop = PullLoop(nc, stream, durable, consume, batch=10, redeclare=declare_again)
    running = asyncio.create_task(loop.run())
    try:
        await js.publish(subject, b"first")
        await wait_until_async(lambda: b"first" in got, 10, 0.05, "the first message")

        # The consumer deleted under the loop (its pull request is pending on the server).
        await js.delete_consumer(stream, durable)
        await js.publish(subject, b"second")
        await wait_until_async(lambda: b"second" in got, 20, 0.05, f"after delete: {got}")
        # Declared again; on a loaded machine an attempt may time out first and be retried.
        assert declared and declared[-1] == "ok", (declared, errors)
        before = len(declared)

        # The stream gone too, as with a lost store: declaring fails until it is back.
        await js.delete_stream(stream)
        await wait_until_async(
            lambda: "failed" in declared[before:], 20, 0.05, "a declaring refused"
        )
        await js.add_stream(config)  # its declarer (`heteroflow up`) makes it again
        await js.publish(subject, b"third")
        await wait_until_async(lambda: b"third" in got, 20, 0.05, f"after the stream: {got}")
        assert declared[-1] == "ok" and "failed" in declared[before:-1], (declared, errors)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        with contextlib.suppress(Exception):
            await js.delete_stream(stream)


async def test_a_pull_loop_takes_each_message_once_in_order_and_stops_while_waiting(
    nc: Client,
) -> None:
    """The loop's own inbox buffer: what is stored is handed over in stream order, each
    message once, in batches no larger than asked; a message published while the loop waits
    on an idle server is taken at once; stopped while it waits, the loop ends at once."""
    js = nc.jetstream()
    tag = uuid.uuid4().hex[:8]
    stream, durable, subject = f"T_{tag}", f"d_{tag}", f"t.{tag}.x"
    await js.add_stream(StreamConfig(name=stream, subjects=[f"t.{tag}.>"]))
    await ensure_durable_consumer(js, stream, durable, subject)
    for i in range(50):
        await js.publish(subject, b"%d" % i)
    got: list[bytes] = []
    sizes: list[int] = []

    async def consume(messages: list[Msg]) -> None:
        sizes.append(len(messages))
        for msg in messages:
            got.append(msg.data)
            await msg.ack()

    loop = PullLoop(nc, stream, durable, consume, batch=8)
    running = asyncio.create_task(loop.run())
    try:
        await wait_until_async(lambda: len(got) >= 50, 10, 0.02, "the stored messages")
        assert got == [b"%d" % i for i in range(50)] and max(sizes) <= 8
        await js.publish(subject, b"late")  # the loop has drained the stream: it waits
        await wait_until_async(lambda: got[-1:] == [b"late"], 2, 0.01, "the late message")
    finally:
        started = asyncio.get_running_loop().time()
        loop.stop(running)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(running, 5)
    # Well under the pull's 5 s wait on the server (IDLE_FETCH_S): it did not wait it out.
    assert asyncio.get_running_loop().time() - started < 1.0, "stopped while waiting"
    assert len(got) == 51, "nothing taken twice"
