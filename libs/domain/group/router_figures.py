"""What the serving routers say, as heard on the bus: the latest figures of each (serving
target, gateway process), each forgotten past a maximum age, so a gateway that stopped
publishing no longer counts. The AutoScaler reads request figures from it, the idle-sleep
controller how long each target has been idle, the rollout controller and the AutoScaler
whether a draining replica still has requests in flight, and which replica of a `split`
group is the least busy. Pure; the clock is injected.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from libs.domain.group.serving import ServingMetrics


class RouterFigures:
    def __init__(self, max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self.clock = clock
        self.since = clock()  # when this book began listening
        self._latest: dict[str, dict[str, tuple[float, ServingMetrics]]] = {}
        # Per target, the latest activity any router reported, on this book's clock: kept
        # past `max_age_s`, so a gateway that went away still dates the last request it saw.
        self._activity: dict[str, float] = {}

    async def hear(self, m: ServingMetrics) -> None:
        """The bus handler (`hf.serving.*.metrics`)."""
        self.record(m)

    def record(self, m: ServingMetrics) -> None:
        heard = self.clock()
        self._latest.setdefault(m.target_id, {})[m.gateway] = (heard, m)
        if m.concurrent_requests or m.queued_requests:
            at: float | None = heard
        else:
            at = None if m.idle_s is None else heard - m.idle_s
        if at is not None:
            self._activity[m.target_id] = max(at, self._activity.get(m.target_id, at))

    def samples(self, target_id: str) -> list[ServingMetrics]:
        """The fresh figures of `target_id`, one per gateway process."""
        now = self.clock()
        by_gateway = self._latest.get(target_id, {})
        for gateway, (heard, _) in list(by_gateway.items()):
            if now - heard > self.max_age_s:
                del by_gateway[gateway]
        return [m for _, m in by_gateway.values()]

    def listening_s(self) -> float:
        """How long this book has been listening."""
        return self.clock() - self.since

    def busy(self, target_id: str) -> bool:
        """A fresh router holds a request for `target_id`, in flight or queued."""
        return any(m.concurrent_requests or m.queued_requests for m in self.samples(target_id))

    def activity_s(self, target_id: str) -> float | None:
        """Seconds since the latest activity any router reported for `target_id`: its last
        request, or when it began watching a target it has routed none for (None: no
        router has reported the target)."""
        at = self._activity.get(target_id)
        return None if at is None else max(0.0, self.clock() - at)

    def outstanding(self, target_id: str) -> dict[str, int]:
        """Requests in flight per replica of `target_id`, summed over the fresh routers (a
        scale-down of a `split` group sheds the least busy)."""
        total: dict[str, int] = {}
        for m in self.samples(target_id):
            for task_id, n in m.outstanding.items():
                total[task_id] = total.get(task_id, 0) + n
        return total

    def drained(self, target_id: str, task_id: str) -> bool:
        """Every gateway that reported `target_id` lately knows `task_id` is draining (so
        sends it nothing new) and has no request in flight on it; with no gateway reporting,
        nothing routes to it."""
        return all(
            task_id in m.draining and m.outstanding.get(task_id, 0) == 0
            for m in self.samples(target_id)
        )
