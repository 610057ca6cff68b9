"""Finished attempts kept for their logs, then removed: the node's disk stays bounded.

Once an attempt's exit is reported (exit code and output tail are in the report), what the
runtime still holds of it (the process runtime's task directory, the docker runtime's exited
container) serves only `GET /tasks/{id}/logs`. The agent keeps the newest `keep` of them, none
older than `keep_s`, and removes the rest through the runtime's `remove`. The window is in
the order the attempts finished, whatever order they are handed in: attempts re-adopted after
a restart come in the order the runtime lists them (docker: newest first), and the newest must
not be the first to go.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import structlog

from .runtimes.base import Handle

log = structlog.get_logger(__name__)

Key = tuple[str, int]  # (task id, attempt)


class Retention:
    def __init__(
        self,
        remove: Callable[[Handle], Awaitable[None]],
        *,
        keep: int,
        keep_s: float,
        enabled: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`keep`: finished attempts kept; `keep_s`: the longest one is kept (0 = no age
        limit); `enabled` False keeps everything (removal is the operator's business)."""
        self._remove = remove
        self.keep = max(0, keep)
        self.keep_s = keep_s
        self.enabled = enabled
        self.clock = clock
        self._kept: OrderedDict[Key, tuple[Handle, float]] = OrderedDict()
        self._latest: dict[str, Handle] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def handle_for(self, task_id: str) -> Handle | None:
        """The newest kept attempt of `task_id`."""
        return self._latest.get(task_id)

    async def finished(self, handle: Handle, at: float | None = None) -> None:
        """Record an attempt whose exit has been reported, finished at `at` (wall time;
        default now); remove what falls out of the window."""
        key = (handle.task_id, handle.attempt)
        self._kept.pop(key, None)
        at = self.clock() if at is None else min(at, self.clock())
        last = next(reversed(self._kept.values()), None)
        self._kept[key] = (handle, at)
        if last is not None and at < last[1]:
            # Finished before one already kept (re-adopted): put it in its place.
            self._kept = OrderedDict(sorted(self._kept.items(), key=lambda kv: kv[1][1]))
        latest = self._latest.get(handle.task_id)
        if latest is None or latest.attempt <= handle.attempt:
            self._latest[handle.task_id] = handle
        await self.prune()

    def due(self) -> list[Handle]:
        """Attempts past the count or the age, oldest first."""
        if not self.enabled:
            return []
        over = max(0, len(self._kept) - self.keep)
        horizon = self.clock() - self.keep_s if self.keep_s > 0 else None
        out = []
        for i, (handle, at) in enumerate(self._kept.values()):
            if i < over or (horizon is not None and at <= horizon):
                out.append(handle)
            else:
                break  # kept in finishing order: the rest are newer
        return out

    async def prune(self) -> None:
        """Remove what is due."""
        for handle in self.due():
            self._forget(handle)
            try:
                await self._remove(handle)
            except Exception:  # a leftover is logged, never fatal for the agent
                log.exception("finished_attempt_not_removed", task_id=handle.task_id)

    def _forget(self, handle: Handle) -> None:
        self._kept.pop((handle.task_id, handle.attempt), None)
        if self._latest.get(handle.task_id) == handle:
            del self._latest[handle.task_id]
