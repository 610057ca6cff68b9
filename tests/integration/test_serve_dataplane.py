"""The serving data path through the real gateway (its httptools protocol, `serve_here`) over
a real store, to a replica that is an asyncio HTTP server in this test (docs/serving.md,
"The data path"): keep-alive reuse, unbuffered streams, a client that leaves, a replica that
breaks mid-answer, body limit, and the per-target cap shedding with 503 + Retry-After."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from bench.serving import seed_replica
from libs.config import GatewaySettings
from libs.store.eventstore import EventStore
from services.api_gateway.dataplane.proxy import ClientWatch
from services.api_gateway.server import serve_here
from tests.wait import wait_until_async

pytestmark = pytest.mark.integration

TIMEOUT = httpx.Timeout(10.0, connect=2.0)


@dataclass
class Replica:
    """An HTTP/1.1 server: `/health`, `/json`, `/sse` (a first event, the rest once
    `release` is set), `/hold` (never answers), `/die` (breaks the connection mid-answer),
    `POST /upload` (answers the body's size). It notes each connection that asked for
    anything but `/health`, and each held request that saw its connection close."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    connections: int = 0  # connections that carried a request other than /health
    held: int = 0
    held_closed: int = 0
    server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        counted = False
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, *lines = head.decode("latin-1").split("\r\n")
                method, path, _ = line.split(" ", 2)
                headers = dict(h.lower().split(": ", 1) for h in lines if h)
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if path != "/health" and not counted:
                    counted = True
                    self.connections += 1
                if not await self.answer(method, path, body, reader, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def answer(
        self,
        method: str,
        path: str,
        body: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """Answer one request; False when the connection is done."""
        if path == "/hold":
            self.held += 1
            await reader.read()  # until the router closes the connection
            self.held_closed += 1
            return False
        if path in ("/sse", "/die"):
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n" + _chunk(b"data: 0\n\n")
            )
            await writer.drain()
            if path == "/die":
                await asyncio.sleep(0.05)
                writer.transport.abort()
                return False
            await self.release.wait()
            for i in range(1, 4):
                writer.write(_chunk(b"data: %d\n\n" % i))
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return True
        text = b"ok" if path == "/health" else b'{"ok":true}'
        if method == "POST":
            text = str(len(body)).encode()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%b" % (len(text), text))
        await writer.drain()
        return True


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


@dataclass
class Gateway:
    url: str
    port: int
    key: dict[str, str]
    target: str
    replica: Replica

    def serve(self, path: str) -> str:
        return f"{self.url}/serve/{self.target}/{path}"

    async def hold(self) -> asyncio.StreamWriter:
        """A request to `/hold` on a connection of its own (closed by the caller)."""
        _, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(
            f"GET /serve/{self.target}/hold HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: {self.key['Authorization']}\r\n\r\n".encode()
        )
        return writer

    async def released(self) -> bool:
        return await self.outstanding() == 0

    async def outstanding(self) -> int:
        async with httpx.AsyncClient(timeout=TIMEOUT) as client:
            r = await client.get(f"{self.url}/api/v1/tasks/{self.target}/serving", headers=self.key)
        return int(r.json()["replicas"][0]["outstanding"])


@asynccontextmanager
async def gateway(database_url: str, **settings: Any) -> AsyncIterator[Gateway]:
    replica = Replica()
    replica.server = await asyncio.start_server(replica.handle, "127.0.0.1", 0)
    up_port = replica.server.sockets[0].getsockname()[1]
    key, target = await seed_replica(database_url, up_port)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    store = await EventStore.open(database_url, max_size=4)
    stop = asyncio.Event()
    config = GatewaySettings(
        jwt_secret=SecretStr("s" * 32), host="127.0.0.1", port=port, **settings
    )
    started = asyncio.Event()
    server = asyncio.create_task(
        serve_here(config, store, None, stop, sock=sock, started=started.set, freeze_heap=False)  # type: ignore[arg-type]
    )
    try:
        await asyncio.wait_for(started.wait(), 20)
        yield Gateway(
            f"http://127.0.0.1:{port}", port, {"Authorization": f"Bearer {key}"}, target, replica
        )
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server, 15)
        await store.close()
        replica.release.set()
        replica.server.close()
        sock.close()


async def test_sequential_requests_share_one_upstream_connection(database_url: str) -> None:
    async with gateway(database_url) as gw:
        async with httpx.AsyncClient(timeout=TIMEOUT) as client:
            for _ in range(20):
                r = await client.get(gw.serve("json"), headers=gw.key)
                assert r.status_code == 200 and r.json() == {"ok": True}, r.text
                assert r.headers["x-heteroflow-replica"] == gw.target
        # One more from a new client connection: the replica's connection is the same too.
        async with httpx.AsyncClient(timeout=TIMEOUT) as client:
            r = await client.get(gw.serve("json"), headers=gw.key)
        assert r.status_code == 200
        assert gw.replica.connections == 1


async def test_a_proxied_request_leaves_no_cycle_for_the_collector(database_url: str) -> None:
    # Objects in a reference cycle wait for a collection of their generation; under load
    # those pile into full collections that stop the worker for tens of milliseconds. A
    # request's own objects must go with their last reference.
    async with gateway(database_url) as gw, httpx.AsyncClient(timeout=TIMEOUT) as client:
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds is kept to be looked at
        try:
            for _ in range(50):
                r = await client.get(gw.serve("json"), headers=gw.key)
                assert r.status_code == 200, r.text
            gc.collect()
            left = [type(o).__name__ for o in gc.garbage if isinstance(o, ClientWatch)]
            cycles = [o for o in gc.garbage if type(o).__name__ == "RequestResponseCycle"]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert left == [] and cycles == [], (len(left), len(cycles))


async def test_an_event_stream_passes_through_unbuffered(database_url: str) -> None:
    async with gateway(database_url) as gw, httpx.AsyncClient(timeout=TIMEOUT) as client:
        async with client.stream("GET", gw.serve("sse"), headers=gw.key) as r:
            assert r.status_code == 200
            pieces = r.aiter_raw()
            first = await asyncio.wait_for(anext(pieces), 5)
            # The replica has not finished (it waits for `release`): the first event came alone.
            assert first == b"data: 0\n\n" and not gw.replica.release.is_set()
            gw.replica.release.set()
            rest = b"".join([p async for p in pieces])
        assert rest == b"data: 1\n\ndata: 2\n\ndata: 3\n\n"


async def test_a_client_that_leaves_cancels_its_upstream_request(database_url: str) -> None:
    async with gateway(database_url) as gw:
        writer = await gw.hold()
        await wait_until_async(lambda: gw.replica.held == 1, 5, message="the replica holds it")
        assert await gw.outstanding() == 1
        writer.close()
        await wait_until_async(
            lambda: gw.replica.held_closed == 1, 5, message="the upstream connection closed"
        )
        await wait_until_async(gw.released, 5, message="outstanding released")
        async with httpx.AsyncClient(timeout=TIMEOUT) as client:
            r = await client.get(gw.serve("json"), headers=gw.key)
        assert r.status_code == 200


async def test_a_replica_that_breaks_mid_answer_fails_that_stream_only(database_url: str) -> None:
    async with gateway(database_url) as gw, httpx.AsyncClient(timeout=TIMEOUT) as client:

        async def read(path: str) -> bytes:
            async with client.stream("GET", gw.serve(path), headers=gw.key) as r:
                assert r.status_code == 200
                return b"".join([p async for p in r.aiter_raw()])

        healthy = asyncio.create_task(read("sse"))
        with pytest.raises(httpx.RemoteProtocolError):
            await read("die")  # the client sees the answer end short, not a clean end
        gw.replica.release.set()
        assert await healthy == b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\n"
        r = await client.get(gw.serve("json"), headers=gw.key)
        assert r.status_code == 200


async def test_bodies_over_the_limit_get_413_and_under_it_pass(database_url: str) -> None:
    async with gateway(database_url, serve_max_body_bytes=1000) as gw:
        async with httpx.AsyncClient(timeout=TIMEOUT) as client:
            ok = await client.post(gw.serve("upload"), content=b"x" * 1000, headers=gw.key)
            assert ok.status_code == 200 and ok.text == "1000"
            big = await client.post(gw.serve("upload"), content=b"x" * 1001, headers=gw.key)
            assert big.status_code == 413 and big.json()["code"] == 41301, big.text

            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(3):
                    yield b"y" * 600

            streamed = await client.post(gw.serve("upload"), content=chunks(), headers=gw.key)
            assert streamed.status_code == 413 and streamed.json()["code"] == 41301
        assert await gw.outstanding() == 0


@pytest.mark.parametrize("dataplane", [True, False], ids=["dataplane", "application"])
async def test_past_the_cap_requests_are_shed_with_503_and_retry_after(
    database_url: str, dataplane: bool
) -> None:
    async with gateway(database_url, serve_max_outstanding=2, serve_dataplane=dataplane) as gw:
        held = [await gw.hold() for _ in range(2)]
        await wait_until_async(lambda: gw.replica.held == 2, 5, message="two requests held")
        async with httpx.AsyncClient(timeout=TIMEOUT) as client:
            shed = await client.get(gw.serve("json"), headers=gw.key)
            assert shed.status_code == 503, shed.text
            assert shed.headers["retry-after"] == "1" and shed.json()["code"] == 50303
            assert "HETEROFLOW_SERVE_MAX_OUTSTANDING=2" in shed.json()["error"]
        for writer in held:
            writer.close()
        await wait_until_async(gw.released, 5, message="outstanding released")


def test_the_data_path_on_uvloop(database_url: str) -> None:
    """The gateway's worker processes run on uvloop, whose transports differ from asyncio's."""
    import uvloop

    async def run() -> None:
        async with gateway(database_url) as gw, httpx.AsyncClient(timeout=TIMEOUT) as client:
            for _ in range(3):
                r = await client.get(gw.serve("json"), headers=gw.key)
                assert r.status_code == 200 and r.json() == {"ok": True}, r.text
            assert gw.replica.connections == 1
            gw.replica.release.set()
            r = await client.get(gw.serve("sse"), headers=gw.key)
            assert r.text == "".join(f"data: {i}\n\n" for i in range(4))

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run())
