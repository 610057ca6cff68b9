"""GPU samples through the sink, read back by /gpu-metrics and /energy (real PostgreSQL)."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from agent.inventory import declared_gpus
from agent.telemetry import sample
from agent.vendors import recorded_tools
from libs.domain.telemetry import GpuSample, TelemetryBatch
from libs.store import telemetry as telemetry_rows
from services.event_timeline.handlers.telemetry import TelemetrySink

from .helpers import Api

pytestmark = pytest.mark.integration
AMD_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vendors" / "amd"


async def test_metrics_and_energy_from_samples(api: Api) -> None:
    r = await api.client.post(
        "/api/v1/tasks", headers=api.tenant, json={"name": "t", "image": "x", "gpu_required": 1}
    )
    tid = r.json()["id"]
    await api.place(tid, "n1")  # samples are kept for tasks placed on the sending node only
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


async def test_samples_for_a_task_on_another_node_are_dropped_and_counted(api: Api) -> None:
    """An agent's forged 999 W "measured" for a task placed elsewhere (and for one not placed
    at all) writes nothing for them and is counted; its own task's sample is kept, shared by
    itself alone."""
    ids = []
    for _ in range(3):
        r = await api.client.post(
            "/api/v1/tasks", headers=api.tenant, json={"name": "t", "image": "x", "gpu_required": 1}
        )
        ids.append(r.json()["id"])
    ours, elsewhere, unplaced = ids
    await api.place(ours, "n1")
    await api.place(elsewhere, "n2")
    before = REGISTRY.get_sample_value("heteroflow_foreign_references_total", {"kind": "telemetry"})
    sample = GpuSample(
        gpu_id="GPU-0",
        task_ids=(ours, elsewhere, unplaced),
        utilization_pct=99,
        memory_used_mb=1000,
        memory_total_mb=80000,
        power_w=999.0,
        at=datetime.now(UTC).replace(microsecond=0),
    )
    await TelemetrySink(api.store).write(TelemetryBatch(node_id="n1", samples=(sample,)))
    after = REGISTRY.get_sample_value("heteroflow_foreign_references_total", {"kind": "telemetry"})
    assert (after or 0) - (before or 0) == 2
    for tid in (elsewhere, unplaced):
        body = (await api.client.get(f"/api/v1/tasks/{tid}/energy", headers=api.tenant)).json()
        assert body["measured"] is False and "no GPU samples" in body["note"]
    samples = await telemetry_rows.power(api.store, ours)
    assert [(s.power_w, s.shared_by) for s in samples] == [(999.0, 1)]


async def test_simulated_amd_card_reports_through_the_amd_smi_parser(
    api: Api, tmp_path: Path
) -> None:
    """A declared AMD card on a simulated node: its recorded `amd-smi metric --json` output goes
    through the same parser and sampler as a real tool's, then the sink and the API."""
    shutil.copy(AMD_FIXTURES / "amd-smi-metric.json", tmp_path / "amd-smi-metric-json")
    run, which = recorded_tools(tmp_path)
    cards = declared_gpus("amd:MI300X:196608", node_id="n1")
    r = await api.client.post(
        "/api/v1/tasks", headers=api.tenant, json={"name": "t", "image": "x", "gpu_required": 1}
    )
    tid = r.json()["id"]
    await api.place(tid, "n1")
    now = datetime.now(UTC).replace(microsecond=0)
    samples = sample({cards[0].uuid: [tid]}, now, cards=cards, run=run, which=which, detect=False)
    assert len(samples) == 1
    await TelemetrySink(api.store).write(TelemetryBatch(node_id="n1", samples=tuple(samples)))
    r = await api.client.get(f"/api/v1/tasks/{tid}/gpu-metrics", headers=api.tenant)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["measured"] and body["series"][0]["gpu_id"] == cards[0].uuid
    (point,) = body["series"][0]["points"]
    assert point["power_w"] == 20.0


async def test_a_missing_vendor_tool_is_a_note_on_the_node(api: Api, tmp_path: Path) -> None:
    """A node declaring AMD and Ascend cards without their tools (an empty recorded-outputs
    directory, as `HETEROFLOW_VENDOR_TOOL_OUTPUTS` gives a simulated node): what the agent
    registers, and the node API then shows, says why each vendor's cards report no metrics."""
    from agent.inventory import Inventory
    from agent.settings import node_inventory
    from agent.vendors import telemetry_notes
    from libs.domain.node.events import NodeRegistered
    from libs.store.projections import NODES

    run, which = recorded_tools(tmp_path)
    gpus = declared_gpus("amd:MI300X:196608,huawei:Ascend910B:65536", node_id="n1")
    inv = Inventory(node_id="n1", hostname="h", memory_mb=8192, cpu_cores=4, gpus=tuple(gpus))
    notes = telemetry_notes([g.vendor for g in gpus], which, run)
    reg = NodeRegistered(node_id="n1", inventory=node_inventory(inv, "10.1.2.3", notes))
    await api.store.execute_aggregate(NODES, "n1", lambda _n: [reg])
    r = await api.client.get("/api/v1/nodes/n1", headers=api.operator)
    assert r.status_code == 200, r.text
    assert r.json()["inventory"]["telemetry"] == {
        "amd": "amd-smi not found on PATH; rocm-smi not found on PATH;"
        " these cards report no metrics",
        "huawei": "npu-smi not found on PATH; these cards report no metrics",
    }
