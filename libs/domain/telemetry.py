"""GPU telemetry messages: what an agent publishes on `hf.node.<id>.telemetry`.

The sampling itself (NVML) lives in the agent; consumers (the telemetry sink, the autoscaler)
depend only on these models.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict


class GpuSample(BaseModel):
    model_config = ConfigDict(frozen=True)

    gpu_id: str
    task_ids: tuple[str, ...]
    utilization_pct: float
    memory_used_mb: float
    memory_total_mb: float
    power_w: float | None  # some boards do not report power
    temperature_c: float | None = None  # vendor tools' reading; NVML samples leave it unset
    health: str = "unknown"  # ok | warning | critical | unknown (agent/vendors: the tool's word)
    at: datetime


class TelemetryBatch(BaseModel):
    """What an agent publishes on `hf.node.<id>.telemetry` (core NATS)."""

    model_config = ConfigDict(frozen=True)

    node_id: str
    samples: tuple[GpuSample, ...]
