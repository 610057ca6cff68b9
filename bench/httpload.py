"""A minimal HTTP/1.1 keep-alive client for load generation: one request in flight per
connection, the request bytes built once.

Why not httpx: it costs 4-5 ms of CPU per request here (request and response models, header
normalisation, its connection pool), so on two shared cores a generator built on it cannot
offer more than a few hundred requests a second while the server under test needs the same
cores. This one parses only what the benchmark reads (status line, `Content-Length`), about
a twentieth of that, so the figures measure the server. It speaks only to our own gateway:
no chunked bodies, no redirects, no TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any


class HttpError(Exception):
    """The connection failed or the answer was not HTTP/1.1 as this client reads it."""


def build_request(method: str, host: str, path: str, headers: dict[str, str], body: Any) -> bytes:
    data = json.dumps(body).encode() if body is not None else b""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(data)}"]
    if body is not None:
        lines.append("Content-Type: application/json")
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


class Connection:
    """One keep-alive connection; `request` sends prepared bytes and returns (status, body)."""

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        try:
            return await asyncio.wait_for(self._exchange(raw), self.timeout_s)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            await self.close()  # the stream's state is unknown: start afresh next time
            raise HttpError(type(exc).__name__) from exc

    async def _exchange(self, raw: bytes) -> tuple[int, bytes]:
        if self._writer is None or self._writer.is_closing():
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        self._writer.write(raw)
        head = await self._reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split(" ", 2)[1])
        length = 0
        close = False
        for line in header_lines:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection" and value.strip().lower() == "close":
                close = True
        body = await self._reader.readexactly(length) if length else b""
        if close:
            await self.close()
        return status, body

    async def close(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
