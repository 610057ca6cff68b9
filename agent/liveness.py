"""Per-task liveness evidence for the heartbeats (libs/domain/task/liveness.py, docs/serving.md).

For every tracked inference task: the runtime's view of its container and, when the task
declares a health path, whether it answers 2xx within `timeout_s`. Collected in its own
loop, so a frozen container whose health check hangs never delays a heartbeat.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import httpx

from libs.domain.task.liveness import Health, TaskLiveness

from .runtimes.base import Handle, Runtime


async def _health(client: httpx.AsyncClient, url: str) -> Health:
    if not url:
        return Health.NONE
    try:
        resp = await client.get(url)
    except httpx.HTTPError:
        return Health.FAILING
    return Health.OK if 200 <= resp.status_code < 300 else Health.FAILING


async def _one(
    runtime: Runtime, client: httpx.AsyncClient, handle: Handle, url: str
) -> TaskLiveness:
    try:
        state = (await runtime.inspect(handle)).value
    except Exception:  # the engine does not answer: say nothing positive
        state = "unknown"
    health = (
        await _health(client, url) if state == "running" else Health.FAILING if url else Health.NONE
    )
    return TaskLiveness(container=state, health=health)


async def collect(
    runtime: Runtime, tasks: Iterable[tuple[str, Handle, str]], timeout_s: float = 2.0
) -> dict[str, TaskLiveness]:
    """`tasks`: (task id, handle, health URL or "") of each tracked inference task."""
    items = list(tasks)
    if not items:
        return {}
    async with httpx.AsyncClient(timeout=timeout_s, trust_env=False) as client:
        found = await asyncio.gather(*(_one(runtime, client, h, url) for _, h, url in items))
    return {tid: ev for (tid, _, _), ev in zip(items, found, strict=True)}
