"""Pipelined JetStream publishes whose every answer resolves its future, refusals included.

nats-py's `publish_async` never resolves the future of a publish the server refused (its reply
handler raises instead of setting the error), so a caller can only wait for its timeout. The
outbox relay chains its publishes with `Nats-Expected-Last-Sequence` and must learn at once
that one was refused; `AckInbox` subscribes to one reply prefix and resolves each message's
future with its `PubAck` or with the `APIError` the server answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import weakref

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import PubAck
from nats.js.errors import APIError, NoStreamResponseError

HDR_STATUS = "Status"
NO_RESPONDERS = "503"


class AckInbox:
    """One reply subscription for many pipelined publishes on `nc`."""

    _shared: weakref.WeakKeyDictionary[Client, AckInbox] = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, nc: Client) -> AckInbox:
        """The inbox shared by every caller on `nc` (it lives as long as the client)."""
        inbox = cls._shared.get(nc)
        if inbox is None:
            inbox = cls._shared[nc] = cls(nc)
        return inbox

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self._prefix = ""
        self._sub: Subscription | None = None
        self._pending: dict[str, asyncio.Future[PubAck]] = {}
        self._tokens = itertools.count()

    async def publish(
        self, subject: str, payload: bytes, headers: dict[str, str]
    ) -> asyncio.Future[PubAck]:
        """Send one message; the future resolves with its ack or its refusal. A future the
        caller cancels (a timeout) is forgotten."""
        if self._sub is None:
            self._prefix = self.nc.new_inbox()
            self._sub = await self.nc.subscribe(self._prefix + ".*", cb=self._answer)
        token = str(next(self._tokens))
        future: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
        self._pending[token] = future
        future.add_done_callback(lambda _f: self._pending.pop(token, None))
        try:
            await self.nc.publish(
                subject, payload, reply=f"{self._prefix}.{token}", headers=headers
            )
        except BaseException:
            future.cancel()
            raise
        return future

    async def _answer(self, msg: Msg) -> None:
        future = self._pending.get(msg.subject[len(self._prefix) + 1 :])
        if future is None or future.done():
            return
        if msg.headers and msg.headers.get(HDR_STATUS) == NO_RESPONDERS:
            future.set_exception(NoStreamResponseError())
            return
        try:
            resp = json.loads(msg.data)
        except ValueError as exc:
            future.set_exception(APIError(description=f"unreadable answer: {exc}"))
            return
        if "error" in resp:
            err = resp["error"]
            future.set_exception(
                APIError(
                    code=err.get("code"),
                    description=err.get("description"),
                    err_code=err.get("err_code"),
                )
            )
        else:
            future.set_result(PubAck.from_response(resp))

    async def close(self) -> None:
        for future in list(self._pending.values()):
            future.cancel()
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        self._sub = None
