"""GPU samples through the sink, read back by /gpu-metrics and /energy (real PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from libs.domain.telemetry import GpuSample, TelemetryBatch
from services.event_timeline.telemetry import TelemetrySink

from .helpers import Api

pytestmark = pytest.mark.integration


async def test_metrics_and_energy_from_samples(api: Api) -> None:
    r = await api.client.post(
        "/api/v1/tasks", headers=api.tenant, json={"name": "t", "image": "x", "gpu_required": 1}
    )
    tid = r.json()["id"]
    now = datetime.now(UTC).replace(microsecond=0)
    samples = tuple(
        GpuSample(
            gpu_id="GPU-0",
            task_ids=(tid,),
            utilization_pct=50 + i,
            memory_used_mb=1000,
            memory_total_mb=80000,
            power_w=300.0,
            at=now - timedelta(seconds=60 - 10 * i),
        )
        for i in range(7)
    )
    await TelemetrySink(api.store).write(TelemetryBatch(node_id="n1", samples=samples))
    r = await api.client.get(f"/api/v1/tasks/{tid}/gpu-metrics?step=30", headers=api.tenant)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["measured"] and body["series"][0]["gpu_id"] == "GPU-0"
    points = body["series"][0]["points"]
    assert 2 <= len(points) <= 3 and all(p["power_w"] == 300.0 for p in points)
    r = await api.client.get(f"/api/v1/tasks/{tid}/energy", headers=api.tenant)
    energy = r.json()
    assert energy["kwh"] == pytest.approx(0.005) and not energy["estimated"]
    assert len(energy["cards"][0]["power_curve"]) == 7


async def test_declared_cards_report_no_numbers(api: Api) -> None:
    r = await api.client.post("/api/v1/tasks", headers=api.tenant, json={"name": "t", "image": "x"})
    tid = r.json()["id"]
    body = (await api.client.get(f"/api/v1/tasks/{tid}/energy", headers=api.tenant)).json()
    assert body["measured"] is False and body["kwh"] == 0 and "no GPU samples" in body["note"]
    r = await api.client.get(f"/api/v1/tasks/{tid}/gpu-metrics?step=0", headers=api.tenant)
    assert r.status_code == 400 and r.json()["fields"] == ["step"]
