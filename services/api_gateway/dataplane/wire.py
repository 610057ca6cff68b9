"""The pure parts of the data path: what is a `/serve/` request, the head sent to a replica,
the headers sent back, the error answers (bytes in, bytes out; no I/O)."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import unquote_to_bytes

import orjson

PREFIX = "/serve/"
# Hop-by-hop headers (RFC 9110 §7.6.1), the platform's own credential, and the framing,
# which the data path sets itself. `expect`: the gateway answers 100-continue to the client
# and sends the body at once.
HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"authorization",
        b"content-length",
        b"expect",
    }
)
# The methods the API's `/serve/` route takes (routes_serve.METHODS); others get its 405.
SERVE_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})
REPLICA_HEADER = b"x-heteroflow-replica"
JSON_HEADERS = [(b"content-type", b"application/json")]


def target_of(path: str) -> str | None:
    """The target id of a `/serve/{target}/{path}` path (what the API's route matches: a
    slash after a non-empty id), or None for any other path."""
    if not path.startswith(PREFIX):
        return None
    end = path.find("/", len(PREFIX))
    if end <= len(PREFIX):
        return None
    return path[len(PREFIX) : end]


def upstream_path(raw_path: bytes, query: bytes) -> bytes:
    """The replica's path: what follows `/serve/{target}`, as the client encoded it."""
    end = raw_path.find(b"/", len(PREFIX))
    rest = raw_path[end:] if end > 0 else b"/"
    return rest + b"?" + query if query else rest


def has_nul(path: str, query: bytes) -> bool:
    """A NUL in the path or (encoded or not) in the query: refused as the API refuses it."""
    return "\x00" in path or (b"\x00" in unquote_to_bytes(query) if query else False)


class Framing:
    """How a request's body is framed: a declared length, chunked, or none."""

    __slots__ = ("length", "chunked")

    def __init__(self, headers: Iterable[tuple[bytes, bytes]]) -> None:
        self.length: int | None = None
        self.chunked = False
        for name, value in headers:
            if name == b"content-length" and value.isdigit():
                self.length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                self.chunked = True
        if self.chunked:
            self.length = None  # RFC 9112 §6.3: chunked wins

    @property
    def streamed(self) -> bool:
        """Whether there is a body to send on (HTTP/1.1: a non-zero length, or chunked)."""
        return self.chunked or bool(self.length)


def forwarded_headers(headers: Iterable[tuple[bytes, bytes]], framing: Framing) -> bytes:
    """The header lines sent to every replica tried for one request (the host aside)."""
    lines = [name + b": " + value + b"\r\n" for name, value in headers if name not in HOP]
    if framing.chunked:
        lines.append(b"transfer-encoding: chunked\r\n")
    elif framing.length is not None:
        lines.append(b"content-length: " + str(framing.length).encode() + b"\r\n")
    return b"".join(lines)


def request_head(method: str, target: bytes, address: str, header_lines: bytes) -> bytes:
    return b"".join(
        (
            method.encode("ascii"),
            b" ",
            target,
            b" HTTP/1.1\r\nhost: ",
            address.encode("ascii"),
            b"\r\n",
            header_lines,
            b"\r\n",
        )
    )


def chunk(data: bytes) -> bytes:
    """One piece of a chunked body."""
    return b"%x\r\n%b\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"


def answer_headers(
    upstream: Iterable[tuple[bytes, bytes]], replica: bytes
) -> list[tuple[bytes, bytes]]:
    """The replica's headers for the client: hop-by-hop ones dropped, its Content-Length
    kept (the raw, still encoded bytes pass through as they are), the replica named."""
    out = []
    for name, value in upstream:
        lower = name.lower()
        if lower not in HOP or lower == b"content-length":
            out.append((lower, value))
    out.append((REPLICA_HEADER, replica))
    return out


def error_json(message: str, code: int, fields: list[str] | None = None) -> bytes:
    """The error shape of SPEC §2 (errors.error_body, as bytes)."""
    body: dict[str, object] = {"error": message, "code": int(code)}
    if fields:
        body["fields"] = fields
    return orjson.dumps(body)
