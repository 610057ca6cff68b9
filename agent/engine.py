"""Engine sleep mode: release a serving replica's VRAM through the engine's own endpoint.

vLLM's sleep mode (`POST /sleep?level=1`, `POST /wake_up`) offloads the weights and frees
the KV cache, which pausing the container cannot do: a frozen process keeps its VRAM. The
agent tries the endpoint first and falls back to pausing when the engine has none (any
answer but 2xx, or no answer). docs/serving.md.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import structlog

from .inventory import GpuInfo
from .runtimes.base import Handle, Runtime
from .telemetry import sample
from .vendors import Runner, Which

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


async def vram_held_mb(
    gpu_ids: tuple[str, ...],
    detect: bool,
    declared_file: Path | None = None,
    cards: Sequence[GpuInfo] = (),
    tools: tuple[Runner, Which] | None = None,
) -> float | None:
    """VRAM in use on the task's cards (NVML, off the loop); None when nothing can be read
    (no card, NVML off, or declared cards of other vendors). Cards NVML cannot see are read
    from `declared_file` when one is set (see `declared_vram_mb`). Other vendors' `cards` are
    read through their vendor tool (agent/vendors), as telemetry reads them (`tools`: the
    runner and `which` to use, e.g. recorded outputs on a simulated node)."""
    if not gpu_ids:
        return None
    others = [c for c in cards if c.vendor != "nvidia"]
    seams: dict[str, Any] = {"run": tools[0], "which": tools[1]} if tools else {}
    if detect or others:
        holders = {g: ["-"] for g in gpu_ids}
        samples = await asyncio.to_thread(
            functools.partial(
                sample, holders, datetime.now(UTC), cards=others, detect=detect, **seams
            )
        )
        if samples:
            return round(sum(s.memory_used_mb for s in samples), 1)
    return declared_vram_mb(gpu_ids, declared_file) if declared_file else None


def declared_vram_mb(gpu_ids: tuple[str, ...], path: Path) -> float | None:
    """VRAM in use on declared cards, from a JSON map card id → MB that the node's own tool
    keeps (HETEROFLOW_DECLARED_VRAM_FILE; the stand-in for NVML that declared cards have, as
    HETEROFLOW_DECLARED_GPUS stands in for detection). None when the file or a card's figure
    is missing or unreadable: no reading is better than a made-up one."""
    try:
        figures = json.loads(path.read_text())
        return round(sum(float(figures[g]) for g in gpu_ids), 1)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.info("declared_vram_unreadable", path=str(path), error=str(exc))
        return None


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
