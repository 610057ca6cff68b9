"""Which replicas pass their health, and how long a silent router still counts.

The routers' in-flight figures arrive through routes.py into a `RouterFigures` book
(libs/domain/group/router_figures.py): a draining replica is done when it is `drained` there.
Health is probed here the way the router probes it: `GET <serve_address><health_path>`
answering 2xx.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import httpx

from libs.domain.task.model import Task
from libs.domain.task.states import TaskStatus

# A router silent this long about a target no longer routes to it (or has gone).
ROUTER_SILENT_S = 30.0


class HealthProbe:
    """Which running replicas answer their health path with 2xx."""

    def __init__(self, timeout_s: float = 2.0) -> None:
        self.client = httpx.AsyncClient(timeout=timeout_s, trust_env=False)

    async def close(self) -> None:
        await self.client.aclose()

    async def healthy(self, tasks: Iterable[Task]) -> frozenset[str]:
        running = [t for t in tasks if t.status is TaskStatus.RUNNING]
        results = await asyncio.gather(*(self._one(t) for t in running))
        return frozenset(t.id for t, ok in zip(running, results, strict=True) if ok)

    async def _one(self, task: Task) -> bool:
        serving = task.spec.serving
        if serving is None:
            return True  # nothing to probe: running is healthy
        if not task.serve_address:
            return False
        try:
            resp = await self.client.get(f"http://{task.serve_address}{serving.health_path}")
        except httpx.HTTPError:
            return False
        return 200 <= resp.status_code < 300
