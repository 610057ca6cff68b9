"""A bounded pool of daemon threads, for blocking calls that may be abandoned at exit.

`concurrent.futures.ThreadPoolExecutor` joins its threads when the interpreter exits, so a
call blocked in one (the Docker runtime's wait on a container, up to its poll interval) holds
the agent's exit up until it returns: a stopped agent took five seconds to go. These threads
are daemons: the process exits at once and the call is simply abandoned (it only watched).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class DaemonThreads:
    def __init__(self, max_threads: int, name: str) -> None:
        self.max_threads = max(1, max_threads)
        self.name = name
        self._work: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0  # threads waiting for work
        self._queued = 0  # calls not yet taken by a thread

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        done: Future[T] = Future()
        with self._lock:
            self._work.put((done, fn))
            self._queued += 1
            if self._queued > self._idle and self._threads < self.max_threads:
                self._threads += 1
                threading.Thread(
                    target=self._serve, name=f"{self.name}-{self._threads}", daemon=True
                ).start()
        return done

    def shutdown(self) -> None:
        """Each thread ends once it is free (a blocked call is left to finish or not)."""
        with self._lock:
            for _ in range(self._threads):
                self._work.put(None)
                self._queued += 1

    def _serve(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            item = self._work.get()
            with self._lock:
                self._idle -= 1
                self._queued -= 1
            if item is None:
                return
            done, fn = item
            if done.set_running_or_notify_cancel():
                try:
                    done.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    done.set_exception(exc)
