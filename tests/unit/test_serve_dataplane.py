"""The serving data path's pure parts (dataplane/wire.py) and its upstream connection's
parsing and reuse decisions (dataplane/upstream.py, fed bytes through a stand-in transport)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.api_gateway.dataplane import wire
from services.api_gateway.dataplane.proxy import Attempt
from services.api_gateway.dataplane.upstream import (
    READ_HIGH_WATER,
    Upstream,
    UpstreamError,
    UpstreamPool,
)
from services.api_gateway.limits import BodyTooLarge


def test_target_of_matches_the_routes_template_only() -> None:
    assert wire.target_of("/serve/grp-1/v1/chat") == "grp-1"
    assert wire.target_of("/serve/task-2/") == "task-2"
    assert wire.target_of("/serve/task-2") is None  # the API's route needs the slash
    assert wire.target_of("/serve//x") is None
    assert wire.target_of("/api/v1/tasks") is None


def test_upstream_path_keeps_the_clients_encoding_and_query() -> None:
    assert wire.upstream_path(b"/serve/t/v1/a%20b", b"x=1") == b"/v1/a%20b?x=1"
    assert wire.upstream_path(b"/serve/t/", b"") == b"/"


def test_nul_in_path_or_query_is_found() -> None:
    assert wire.has_nul("/serve/t/a\x00", b"")
    assert wire.has_nul("/serve/t/a", b"q=%00")
    assert not wire.has_nul("/serve/t/a", b"q=1")


def test_framing_and_forwarded_headers() -> None:
    headers = [
        (b"authorization", b"Bearer hf_x"),
        (b"content-length", b"5"),
        (b"connection", b"keep-alive"),
        (b"x-trace", b"1"),
        (b"host", b"gw"),
    ]
    framing = wire.Framing(headers)
    assert framing.length == 5 and framing.streamed and not framing.chunked
    assert wire.forwarded_headers(headers, framing) == b"x-trace: 1\r\ncontent-length: 5\r\n"
    chunked = wire.Framing([(b"transfer-encoding", b"chunked"), (b"content-length", b"3")])
    assert chunked.chunked and chunked.length is None
    assert wire.forwarded_headers([], chunked) == b"transfer-encoding: chunked\r\n"
    assert not wire.Framing([(b"content-length", b"0")]).streamed
    head = wire.request_head("GET", b"/v1?x=1", "10.0.0.1:8000", b"a: b\r\n")
    assert head == b"GET /v1?x=1 HTTP/1.1\r\nhost: 10.0.0.1:8000\r\na: b\r\n\r\n"
    assert wire.chunk(b"hello") == b"5\r\nhello\r\n"


def test_answer_headers_drop_hop_by_hop_keep_length_and_name_the_replica() -> None:
    upstream = [
        (b"Content-Type", b"text/plain"),
        (b"Content-Length", b"2"),
        (b"Connection", b"keep-alive"),
        (b"Transfer-Encoding", b"chunked"),
    ]
    assert wire.answer_headers(upstream, b"task-1") == [
        (b"content-type", b"text/plain"),
        (b"content-length", b"2"),
        (b"x-heteroflow-replica", b"task-1"),
    ]


class Transport:
    """What the protocol writes, and whether it closed or paused reading."""

    def __init__(self) -> None:
        self.written = b""
        self.closed = False
        self.reading = True

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def _connected(pool: UpstreamPool) -> tuple[Upstream, Transport]:
    conn = Upstream(pool, "127.0.0.1:1")
    transport = Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


async def test_a_kept_alive_answer_returns_the_connection_to_the_pool() -> None:
    pool = UpstreamPool()
    conn, transport = _connected(pool)
    conn.begin(b"GET / HTTP/1.1\r\n\r\n", head_only=False)
    conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    assert await conn.head() == 200 and (b"Content-Length", b"2") in conn.headers
    assert await conn.read() == b"ok" and conn.at_end
    conn.release()
    assert pool.idle_count("127.0.0.1:1") == 1 and not transport.closed
    assert await pool.get("127.0.0.1:1") is conn  # reused, not a new connection


@pytest.mark.parametrize(
    ("answer", "head_only"),
    [
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", True),  # HEAD: never reused
    ],
)
async def test_answers_that_end_the_connection_close_it(answer: bytes, head_only: bool) -> None:
    pool = UpstreamPool()
    conn, transport = _connected(pool)
    conn.begin(b"X / HTTP/1.1\r\n\r\n", head_only=head_only)
    conn.data_received(answer)
    assert await conn.head() == 200
    while await conn.read() is not None:
        pass
    conn.release()
    assert transport.closed and pool.idle_count("127.0.0.1:1") == 0


async def test_a_body_ended_by_the_connection_is_whole_and_a_cut_one_fails() -> None:
    conn, _ = _connected(UpstreamPool())
    conn.begin(b"GET / HTTP/1.1\r\n\r\n", head_only=False)
    conn.data_received(b"HTTP/1.1 200 OK\r\n\r\ndata: 1\n\n")
    conn.connection_lost(None)
    assert await conn.read() == b"data: 1\n\n" and await conn.read() is None

    conn, _ = _connected(UpstreamPool())
    conn.begin(b"GET / HTTP/1.1\r\n\r\n", head_only=False)
    conn.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
    assert await conn.read() == b"abc"
    conn.connection_lost(ConnectionResetError())
    with pytest.raises(UpstreamError) as broken:
        await conn.read()
    assert broken.value.name == "ReadError"


async def test_closed_before_an_answer_and_garbage_are_protocol_errors() -> None:
    conn, _ = _connected(UpstreamPool())
    conn.begin(b"GET / HTTP/1.1\r\n\r\n", head_only=False)
    conn.connection_lost(None)
    with pytest.raises(UpstreamError) as closed:
        await conn.head()
    assert closed.value.name == "RemoteProtocolError"
    conn, transport = _connected(UpstreamPool())
    conn.begin(b"GET / HTTP/1.1\r\n\r\n", head_only=False)
    conn.data_received(b"SSH-2.0-OpenSSH\r\n")
    with pytest.raises(UpstreamError):
        await conn.head()
    assert transport.closed


async def test_informational_answers_are_skipped_and_a_slow_reader_pauses_the_replica() -> None:
    conn, transport = _connected(UpstreamPool())
    conn.begin(b"POST / HTTP/1.1\r\n\r\n", head_only=False)
    conn.data_received(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert not conn.head_done
    conn.data_received(b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert await conn.head() == 201
    piece = b"x" * 65536
    for _ in range(READ_HIGH_WATER // len(piece) + 1):
        conn.data_received(b"%x\r\n%b\r\n" % (len(piece), piece))
    assert not transport.reading  # more than the high water waits: the replica is not read
    assert len(await conn.read() or b"") > READ_HIGH_WATER
    assert transport.reading


async def test_the_first_byte_deadline_fails_the_exchange() -> None:
    conn, transport = _connected(UpstreamPool())
    conn.begin(b"GET / HTTP/1.1\r\n\r\n", head_only=False)
    conn.first_byte_within(0.01)
    with pytest.raises(UpstreamError) as late:
        await asyncio.wait_for(conn.head(), 5)
    assert late.value.name == "ReadTimeout" and transport.closed


async def test_a_refused_connection_is_a_connect_error() -> None:
    server = await asyncio.start_server(lambda *_: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(UpstreamError) as refused:
        await UpstreamPool().get(f"127.0.0.1:{port}")
    assert refused.value.name == "ConnectError"


async def test_a_replica_silent_mid_answer_past_the_timeout_fails_it() -> None:
    conn, transport = _connected(UpstreamPool())
    conn.begin(b"GET / HTTP/1.1\r\n\r\n", head_only=False)
    conn.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n")
    assert await conn.head() == 200
    conn.silence_within(0.01)
    assert await conn.read() == b"a"
    with pytest.raises(UpstreamError) as silent:
        await asyncio.wait_for(conn.read(), 5)
    assert silent.value.name == "ReadTimeout" and transport.closed


class Sink:
    """Stands in for an upstream connection: what was written to it."""

    def __init__(self) -> None:
        self.sent = b""

    async def write(self, data: bytes) -> None:
        self.sent += data


def _receive(*pieces: bytes) -> Any:
    messages = [
        {"type": "http.request", "body": p, "more_body": i < len(pieces) - 1}
        for i, p in enumerate(pieces)
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    return receive


async def test_a_chunked_body_is_sent_chunked_and_a_small_one_is_kept_for_a_retry() -> None:
    framing = wire.Framing([(b"transfer-encoding", b"chunked")])
    body = Attempt(_receive(b"ab", b"", b"cde"), 100, framing)
    first = Sink()
    await body.send(first)  # type: ignore[arg-type]
    assert first.sent == b"2\r\nab\r\n3\r\ncde\r\n0\r\n\r\n"
    assert body.replayable()
    again = Sink()
    await body.send(again)  # type: ignore[arg-type]
    assert again.sent == first.sent  # the same bytes to the next replica


async def test_a_body_past_the_limit_is_refused_while_read() -> None:
    framing = wire.Framing([(b"transfer-encoding", b"chunked")])
    body = Attempt(_receive(b"x" * 60, b"y" * 60), 100, framing)
    with pytest.raises(BodyTooLarge):
        await body.send(Sink())  # type: ignore[arg-type]


def test_the_data_path_takes_the_methods_of_the_api_route() -> None:
    from services.api_gateway.routes_serve import METHODS

    assert set(METHODS) == wire.SERVE_METHODS
