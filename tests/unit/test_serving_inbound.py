"""The router's reader of a client's request (`Inbound`, services/api_gateway/routes_serve.py):
the body streams chunk by chunk, a small one can be sent again to another replica, a large
one that a replica began to take cannot, a chunked body past the limit is refused, and a
client that leaves cancels what waits for it."""

from __future__ import annotations

import asyncio

import pytest
from starlette.types import Message

from services.api_gateway.limits import BodyTooLarge
from services.api_gateway.routes_serve import REPLAY_MAX_BYTES, ClientGone, Inbound


class Client:
    """An ASGI `receive` fed by the test: body messages, then a disconnect when told."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.messages: asyncio.Queue[Message] = asyncio.Queue()
        for i, chunk in enumerate(chunks):
            more = i < len(chunks) - 1
            self.messages.put_nowait({"type": "http.request", "body": chunk, "more_body": more})

    async def receive(self) -> Message:
        return await self.messages.get()

    def leave(self) -> None:
        self.messages.put_nowait({"type": "http.disconnect"})


async def take(inbound: Inbound, limit: int | None = None) -> tuple[list[bytes], bool]:
    """What one attempt sends (at most `limit` chunks) and whether it said it was sent."""
    sent: list[bool] = []
    got: list[bytes] = []
    async for chunk in inbound.body(lambda: sent.append(True)):
        got.append(chunk)
        if limit is not None and len(got) == limit:
            break
    return got, bool(sent)


async def test_the_body_streams_and_a_small_one_is_sent_again_whole() -> None:
    client = Client([b"ab", b"cd", b"ef"])
    inbound = Inbound(client.receive, 1024)
    inbound.start()
    try:
        assert await take(inbound, limit=2) == ([b"ab", b"cd"], False)  # the replica failed
        assert inbound.replayable()
        assert await take(inbound) == ([b"ab", b"cd", b"ef"], True)  # the next one has it all
        inbound.answered()
        assert not inbound.replayable()
    finally:
        inbound.close()


async def test_a_large_body_a_replica_began_to_take_is_not_sent_again() -> None:
    big = b"x" * (REPLAY_MAX_BYTES // 2 + 1)
    inbound = Inbound(Client([big, big, big]).receive, 10 * REPLAY_MAX_BYTES)
    inbound.start()
    try:
        assert inbound.replayable()  # nothing taken yet: a refused connection loses nothing
        await take(inbound, limit=2)
        assert not inbound.replayable()
    finally:
        inbound.close()


async def test_a_chunked_body_past_the_limit_is_refused() -> None:
    inbound = Inbound(Client([b"x" * 600, b"x" * 600]).receive, 1000)
    inbound.start()
    try:
        with pytest.raises(BodyTooLarge):
            await take(inbound)
    finally:
        inbound.close()


async def test_a_client_that_leaves_cancels_the_wait_and_ends_the_answer() -> None:
    client = Client([b""])
    inbound = Inbound(client.receive, 1024)
    inbound.start()
    waiting = asyncio.Event()

    async def proxied() -> None:
        async with inbound.cancelling():
            waiting.set()
            await asyncio.sleep(60)  # a replica that has not answered

    try:
        request = asyncio.create_task(proxied())
        await waiting.wait()
        client.leave()
        with pytest.raises(ClientGone):
            await asyncio.wait_for(request, 5)
        assert await asyncio.wait_for(inbound.receive(), 1) == {"type": "http.disconnect"}
    finally:
        inbound.close()


async def test_a_request_cancelled_for_another_reason_stays_cancelled() -> None:
    inbound = Inbound(Client([b""]).receive, 1024)
    inbound.start()

    async def proxied() -> None:
        async with inbound.cancelling():
            await asyncio.sleep(60)

    try:
        request = asyncio.create_task(proxied())
        await asyncio.sleep(0.01)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
    finally:
        inbound.close()
