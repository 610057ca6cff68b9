"""GET /tasks/{id}/gpu-metrics and /tasks/{id}/energy, from the agents' NVML samples, and
the same two for a task group (every task the group ever ran, superseded rows included)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from libs.domain.errors import Code, DomainError, NotFound
from libs.domain.task.energy import task_energy
from libs.domain.task.model import Task
from libs.store import groups as group_rows
from libs.store import tasks as task_rows
from libs.store import telemetry
from libs.store.eventstore import EventStore

from .deps import Principal, Store, tenant_scope
from .schemas import GpuMetricsQuery, query_of

router = APIRouter(prefix="/api/v1/tasks", tags=["telemetry"])
group_router = APIRouter(prefix="/api/v1/task-groups", tags=["telemetry"])
NO_SAMPLES = (
    "no GPU samples: the task holds no card NVML can read (declared cards and "
    "CPU-only tasks report no numbers rather than made-up ones)"
)


def _fraction(task: Task) -> float | None:
    spec = task.spec
    if spec.gpu_compute_ratio:
        return spec.gpu_compute_ratio
    return None


Window = tuple[datetime, datetime, int]


Query = Annotated[GpuMetricsQuery, Depends(query_of(GpuMetricsQuery))]


def _window(q: GpuMetricsQuery, now: datetime) -> Window:
    end = q.end or now
    if q.start is not None:
        return q.start, end, q.step
    if end <= datetime.min.replace(tzinfo=end.tzinfo) + timedelta(hours=1):
        raise DomainError(Code.INVALID_VALUE, "end is too early for the default start", ["end"])
    return end - timedelta(hours=1), end, q.step


async def _series(store: EventStore, task: Task, window: Window) -> list[dict[str, Any]]:
    series: dict[str, list[dict[str, Any]]] = {}
    for p in await telemetry.series(store, task.id, *window):
        series.setdefault(p.gpu_id, []).append(
            {
                "t": p.t.isoformat(),
                "utilization_pct": round(p.utilization_pct, 2),
                "memory_used_mb": round(p.memory_used_mb, 1),
                "memory_total_mb": round(p.memory_total_mb, 1),
                "power_w": None if p.power_w is None else round(p.power_w, 1),
            }
        )
    return [{"gpu_id": g, "points": p} for g, p in series.items()]


def _window_body(window: Window, measured: bool) -> dict[str, Any]:
    start, end, step = window
    body: dict[str, Any] = {
        "start": start.isoformat(),
        "end": end.isoformat(),
        "step_s": step,
        "measured": measured,
    }
    return body if measured else body | {"note": NO_SAMPLES}


@router.get("/{task_id}/gpu-metrics")
async def gpu_metrics(task_id: str, principal: Principal, store: Store, q: Query) -> dict[str, Any]:
    window = _window(q, store.clock())
    task = await store.get_task(task_id, tenant_id=tenant_scope(principal))
    series = await _series(store, task, window)
    return {"task_id": task.id} | _window_body(window, bool(series)) | {"series": series}


async def _energy(store: EventStore, task: Task, factor: float) -> dict[str, Any]:
    return task_energy(
        await telemetry.power(store, task.id), fraction=_fraction(task), carbon_g_per_kwh=factor
    )


def _notes(result: dict[str, Any]) -> dict[str, Any]:
    body = dict(result)
    if not result["measured"]:
        body["note"] = NO_SAMPLES
    if result["estimated"]:
        body["estimate_note"] = (
            "a card was shared: this energy is an apportioned estimate, not a per-task measurement"
        )
    return body


@router.get("/{task_id}/energy")
async def energy(
    request: Request, task_id: str, principal: Principal, store: Store
) -> dict[str, Any]:
    task = await store.get_task(task_id, tenant_id=tenant_scope(principal))
    factor = request.app.state.settings.carbon_intensity_g_per_kwh
    return {"task_id": task.id} | _notes(await _energy(store, task, factor))


async def _group_tasks(store: EventStore, group_id: str, principal: Principal) -> list[Task]:
    group = await group_rows.get(store, group_id)
    tenant = tenant_scope(principal)
    if group is None or (tenant is not None and group.tenant_id != tenant):
        raise NotFound("task group")
    tasks = await task_rows.of_group(store, group.id, include_deleted=False)
    return sorted(tasks, key=lambda t: (t.rank if t.rank is not None else -1, t.created_at))


def _member(task: Task) -> dict[str, Any]:
    return {"task_id": task.id, "rank": task.rank, "status": task.status.value}


@group_router.get("/{group_id}/gpu-metrics")
async def group_gpu_metrics(
    group_id: str, principal: Principal, store: Store, q: Query
) -> dict[str, Any]:
    """Each member's series, as `GET /tasks/{id}/gpu-metrics` gives them."""
    window = _window(q, store.clock())
    members = [
        _member(t) | {"series": await _series(store, t, window)}
        for t in await _group_tasks(store, group_id, principal)
    ]
    measured = any(m["series"] for m in members)
    return {"group_id": group_id} | _window_body(window, measured) | {"tasks": members}


@group_router.get("/{group_id}/energy")
async def group_energy(
    request: Request, group_id: str, principal: Principal, store: Store
) -> dict[str, Any]:
    """The sum over every task the group ran, and each task's own figures."""
    factor = request.app.state.settings.carbon_intensity_g_per_kwh
    members = [
        _member(t) | await _energy(store, t, factor)
        for t in await _group_tasks(store, group_id, principal)
    ]
    kwh = sum(float(m["kwh"]) for m in members)
    total = {
        "kwh": round(kwh, 6),
        "carbon_kg": round(kwh * factor / 1000, 6),
        "carbon_g_per_kwh": factor,
        "estimated": any(m["estimated"] for m in members),
        "measured": any(m["measured"] for m in members),
    }
    return {"group_id": group_id} | _notes(total) | {"tasks": members}
