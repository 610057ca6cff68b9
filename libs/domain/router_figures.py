"""What the serving routers say, as heard on the bus: the latest figures of each (serving
target, gateway process), each forgotten past a maximum age, so a gateway that stopped
publishing no longer counts. The AutoScaler reads request figures from it, the rollout
controller whether a draining replica still has requests in flight. Pure; the clock is
injected.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .serving import ServingMetrics


class RouterFigures:
    def __init__(self, max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self.clock = clock
        self._latest: dict[str, dict[str, tuple[float, ServingMetrics]]] = {}

    async def hear(self, m: ServingMetrics) -> None:
        """The bus handler (`hf.serving.*.metrics`)."""
        self.record(m)

    def record(self, m: ServingMetrics) -> None:
        self._latest.setdefault(m.target_id, {})[m.gateway] = (self.clock(), m)

    def samples(self, target_id: str) -> list[ServingMetrics]:
        """The fresh figures of `target_id`, one per gateway process."""
        now = self.clock()
        by_gateway = self._latest.get(target_id, {})
        for gateway, (heard, _) in list(by_gateway.items()):
            if now - heard > self.max_age_s:
                del by_gateway[gateway]
        return [m for _, m in by_gateway.values()]

    def drained(self, target_id: str, task_id: str) -> bool:
        """Every gateway that reported `target_id` lately knows `task_id` is draining (so
        sends it nothing new) and has no request in flight on it; with no gateway reporting,
        nothing routes to it."""
        return all(
            task_id in m.draining and m.outstanding.get(task_id, 0) == 0
            for m in self.samples(target_id)
        )
