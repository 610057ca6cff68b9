"""GET /tasks/{id}/gpu-metrics and /tasks/{id}/energy, from the agents' NVML samples."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from libs.domain.energy import task_energy
from libs.domain.errors import Code, DomainError
from libs.domain.task import Task
from libs.store import telemetry

from .deps import Principal, Store, tenant_scope
from .schemas import GpuMetricsQuery, query_of

router = APIRouter(prefix="/api/v1/tasks", tags=["telemetry"])
NO_SAMPLES = (
    "no GPU samples: the task holds no card NVML can read (declared cards and "
    "CPU-only tasks report no numbers rather than made-up ones)"
)


def _fraction(task: Task) -> float | None:
    spec = task.spec
    if spec.gpu_compute_ratio:
        return spec.gpu_compute_ratio
    return None


@router.get("/{task_id}/gpu-metrics")
async def gpu_metrics(
    task_id: str,
    principal: Principal,
    store: Store,
    q: Annotated[GpuMetricsQuery, Depends(query_of(GpuMetricsQuery))],
) -> dict[str, Any]:
    task = await store.get_task(task_id, tenant_id=tenant_scope(principal))
    step = q.step
    end = q.end or store.clock()
    if q.start is not None:
        start = q.start
    elif end > datetime.min.replace(tzinfo=end.tzinfo) + timedelta(hours=1):
        start = end - timedelta(hours=1)
    else:
        raise DomainError(Code.INVALID_VALUE, "end is too early for the default start", ["end"])
    series: dict[str, list[dict[str, Any]]] = {}
    for p in await telemetry.series(store, task.id, start, end, int(step)):
        series.setdefault(p.gpu_id, []).append(
            {
                "t": p.t.isoformat(),
                "utilization_pct": round(p.utilization_pct, 2),
                "memory_used_mb": round(p.memory_used_mb, 1),
                "memory_total_mb": round(p.memory_total_mb, 1),
                "power_w": None if p.power_w is None else round(p.power_w, 1),
            }
        )
    body: dict[str, Any] = {
        "task_id": task.id,
        "start": start.isoformat(),
        "end": end.isoformat(),
        "step_s": int(step),
        "measured": bool(series),
        "series": [{"gpu_id": g, "points": p} for g, p in series.items()],
    }
    if not series:
        body["note"] = NO_SAMPLES
    return body


@router.get("/{task_id}/energy")
async def energy(
    request: Request, task_id: str, principal: Principal, store: Store
) -> dict[str, Any]:
    task = await store.get_task(task_id, tenant_id=tenant_scope(principal))
    factor = request.app.state.settings.carbon_intensity_g_per_kwh
    result = task_energy(
        await telemetry.power(store, task.id),
        fraction=_fraction(task),
        carbon_g_per_kwh=factor,
    )
    body: dict[str, Any] = {"task_id": task.id, **result}
    if not result["measured"]:
        body["note"] = NO_SAMPLES
    if result["estimated"]:
        body["estimate_note"] = (
            "the card was shared: this task's energy is an apportioned "
            "estimate, not a per-task measurement"
        )
    return body
