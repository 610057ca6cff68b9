"""HTTP calls of the integration tests, each with a timeout that says what it waits for.

The library's default (5 s for everything) hides what a test expects: a request to the API
is answered in milliseconds, so one that takes `REQUEST` seconds has found a stalled
platform, and the test should say so rather than wait on. A caller that waits for something
longer on purpose (a log stream, a slow operation) passes its own `timeout`.
"""

from __future__ import annotations

import threading
from typing import Any, Self

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


class Repeat:
    """Calls `once` on `threads` threads, again and again, while its `with` block runs (load
    beside what a test does); each thread is joined, up to `join_s`, when the block ends."""

    def __init__(self, threads: int = 1, join_s: float = 60.0) -> None:
        self.stop = threading.Event()
        self.join_s = join_s
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def once(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self.stop.is_set():
            self.once()

    def __enter__(self) -> Self:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(self.join_s)
