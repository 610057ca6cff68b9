"""Engine sleep mode: release a serving replica's VRAM through the engine's own endpoint.

vLLM's sleep mode (`POST /sleep?level=1`, `POST /wake_up`) offloads the weights and frees
the KV cache, which pausing the container cannot do: a frozen process keeps its VRAM. The
agent tries the endpoint first and falls back to pausing when the engine has none (any
answer but 2xx, or no answer). docs/serving.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import structlog

from .runtimes.base import Handle, Runtime
from .telemetry import sample

log = structlog.get_logger(__name__)

SLEEP_PATH = "/sleep?level=1"
WAKE_PATH = "/wake_up"
ENGINE_TIMEOUT_S = 60.0  # offloading weights can take a while


async def engine_call(address: str, path: str, timeout_s: float = ENGINE_TIMEOUT_S) -> bool:
    """POST `path` to the replica's serving address; True on a 2xx answer."""
    if not address:
        return False
    try:
        async with httpx.AsyncClient(timeout=timeout_s, trust_env=False) as client:
            resp = await client.post(f"http://{address}{path}")
    except httpx.HTTPError as exc:
        log.info("engine_endpoint_unavailable", address=address, path=path, error=str(exc))
        return False
    log.info("engine_endpoint_answered", address=address, path=path, status=resp.status_code)
    return 200 <= resp.status_code < 300


async def vram_held_mb(gpu_ids: tuple[str, ...], detect: bool) -> float | None:
    """VRAM in use on the task's cards (NVML, off the loop); None when nothing can be read
    (no card, NVML off, or declared cards of other vendors)."""
    if not gpu_ids or not detect:
        return None
    holders = {g: ["-"] for g in gpu_ids}
    samples = await asyncio.to_thread(sample, holders, datetime.now(UTC))
    return round(sum(s.memory_used_mb for s in samples), 1) if samples else None


Vram = Callable[[], Awaitable[float | None]]


async def put_to_sleep(
    runtime: Runtime, handle: Handle, address: str, vram: Vram
) -> tuple[bool, dict[str, Any]]:
    """(slept through the engine?, the report's fields: mode and VRAM before/after)."""
    before = await vram()
    engine = await engine_call(address, SLEEP_PATH)
    if not engine:
        await runtime.pause(handle)
    after = await vram()
    mode = "engine" if engine else "pause"
    log.info(
        "task_asleep", task_id=handle.task_id, mode=mode, vram_before_mb=before, vram_after_mb=after
    )
    return engine, {"sleep_mode": mode, "vram_before_mb": before, "vram_after_mb": after}


async def wake_from_sleep(
    runtime: Runtime, handle: Handle, address: str, engine_slept: bool, vram: Vram
) -> tuple[bool, dict[str, Any]]:
    """(still asleep through the engine?, the report's fields)."""
    mode = "engine" if engine_slept else "pause"
    if engine_slept:
        engine_slept = not await engine_call(address, WAKE_PATH)
    else:
        await runtime.unpause(handle)
    return engine_slept, {"sleep_mode": mode, "vram_after_mb": await vram()}
