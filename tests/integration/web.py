"""HTTP calls of the integration tests, each with a timeout that says what it waits for.

The library's default (5 s for everything) hides what a test expects: a request to the API
is answered in milliseconds, so one that takes `REQUEST` seconds has found a stalled
platform, and the test should say so rather than wait on. A caller that waits for something
longer on purpose (a log stream, a slow operation) passes its own `timeout`.
"""

from __future__ import annotations

from typing import Any

import httpx

# One API request; connecting to a listening local port takes milliseconds.
REQUEST = httpx.Timeout(10.0, connect=2.0)


def get(url: str, **kw: Any) -> httpx.Response:
    kw.setdefault("timeout", REQUEST)
    return httpx.get(url, **kw)


def post(url: str, **kw: Any) -> httpx.Response:
    kw.setdefault("timeout", REQUEST)
    return httpx.post(url, **kw)


def put(url: str, **kw: Any) -> httpx.Response:
    kw.setdefault("timeout", REQUEST)
    return httpx.put(url, **kw)


def delete(url: str, **kw: Any) -> httpx.Response:
    kw.setdefault("timeout", REQUEST)
    return httpx.delete(url, **kw)
