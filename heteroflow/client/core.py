"""What the blocking and the asyncio client share: errors, bodies, retry decisions, pages."""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import BaseModel

from .credentials import API_PREFIX

__all__ = ["API_PREFIX", "ApiError", "SseEvent", "Unreachable", "parse_sse"]

TIMEOUT_S = 30.0
# Methods whose repetition changes nothing more than the first call: only these are retried.
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
RETRY_STATUSES = frozenset({429, 503})
MAX_RETRIES = 3
MAX_RETRY_WAIT_S = 30.0  # a longer Retry-After is not waited for: the error is raised
DEFAULT_PER_PAGE = 100


class ApiError(Exception):
    """A refusal in the API's shape `{"error", "code", "fields"}` (or a bare HTTP error)."""

    def __init__(
        self,
        status: int,
        message: str,
        code: int | None = None,
        fields: list[str] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.fields = list(fields or [])
        self.retry_after = retry_after

    def __str__(self) -> str:
        return f"{self.message} (HTTP {self.status}, code {self.code})"


class Unreachable(Exception):
    """No answer from the server (connection refused, timeout, broken stream); `reason` is
    what httpx said."""

    def __init__(self, server: str, reason: str) -> None:
        super().__init__(f"cannot reach {server}: {reason}")
        self.server, self.reason = server, reason


def api_error(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
    except ValueError:
        body = None
    retry = retry_after(response)
    if isinstance(body, dict) and "error" in body:
        code = body.get("code")
        return ApiError(
            response.status_code,
            str(body["error"]),
            code if isinstance(code, int) and not isinstance(code, bool) else None,
            [str(f) for f in body.get("fields") or []],
            retry,
        )
    text = response.text.strip()[:200] or response.reason_phrase
    return ApiError(response.status_code, f"HTTP {response.status_code}: {text}", None, [], retry)


def retry_after(response: httpx.Response, now: float | None = None) -> float | None:
    """The `Retry-After` header in seconds (delta-seconds or an HTTP date), None if absent
    or unreadable."""
    raw = response.headers.get("Retry-After")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def retry_wait(method: str, response: httpx.Response, attempt: int) -> float | None:
    """Seconds to wait before retrying `response` to `method` (attempt 0 = first retry), or
    None when it must not be retried: not idempotent, not 429/503, no usable Retry-After,
    out of attempts, or asked to wait too long."""
    if method.upper() not in IDEMPOTENT or response.status_code not in RETRY_STATUSES:
        return None
    if attempt >= MAX_RETRIES:
        return None
    wait = retry_after(response)
    if wait is None or wait > MAX_RETRY_WAIT_S:
        return None
    return wait


def body_of(body: BaseModel | Mapping[str, Any] | None) -> Any:
    """A request body as JSON data: a model gives only the fields that were set (so the
    server's defaults apply, as they would to a hand-written body)."""
    if body is None:
        return None
    if isinstance(body, BaseModel):
        return body.model_dump(mode="json", exclude_unset=True)
    return dict(body)


def clean_params(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Query parameters without the unset (None) ones; labels may be a mapping."""
    if not params:
        return None
    out: dict[str, Any] = {}
    for key, value in params.items():
        if value is None:
            continue
        if key == "labels" and isinstance(value, Mapping):
            value = ",".join(f"{k}={v}" for k, v in value.items())
        out[key] = value
    return out or None


@dataclass(frozen=True)
class Listing:
    """A paged list route: its path and the key of its items in the answer."""

    path: str
    key: str


def page_items(data: Any, key: str) -> tuple[list[dict[str, Any]], bool]:
    """The items of one page and whether another page follows (from total/page/per_page)."""
    items = list(data.get(key) or [])
    total, page, per_page = data.get("total"), data.get("page"), data.get("per_page")
    if not isinstance(total, int) or not isinstance(page, int) or not isinstance(per_page, int):
        return items, False
    return items, bool(items) and page * per_page < total


@dataclass
class SseEvent:
    event: str
    data: str


def parse_sse(lines: Iterable[str]) -> Iterator[SseEvent]:
    """Server-Sent Events from decoded lines: `event:`/`data:` fields, a blank line ends one."""
    parser = SseParser()
    for line in lines:
        if (event := parser.feed(line)) is not None:
            yield event
    if parser.data:
        yield SseEvent(parser.event, "\n".join(parser.data))


class SseParser:
    """`parse_sse` one line at a time (for an asyncio stream): `feed` gives the event a
    line completes, if any; `close` the one left unfinished at the end."""

    def __init__(self) -> None:
        self.event: str = "message"
        self.data: list[str] = []

    def feed(self, line: str) -> SseEvent | None:
        if line == "":
            done = self.close()
            self.event, self.data = "message", []
            return done
        if not line.startswith(":"):
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                self.event = value
            elif name == "data":
                self.data.append(value)
        return None

    def close(self) -> SseEvent | None:
        if not self.data and self.event == "message":
            return None
        return SseEvent(self.event, "\n".join(self.data))


def stream_error(event: SseEvent, status: int = 200) -> ApiError:
    """An `error` event of a log stream as an ApiError (its JSON `error`, else its text)."""
    try:
        body = json.loads(event.data)
    except ValueError:
        body = None
    message = body.get("error") if isinstance(body, dict) else None
    return ApiError(status, str(message or event.data or "the stream ended with an error"))
