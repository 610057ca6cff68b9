"""Telemetry sink: GPU samples from agents into `gpu_samples` (one row per task and card).

A card shared by several tasks is recorded for each with `shared_by`, so energy can be
apportioned later and marked as an estimate.
"""

from __future__ import annotations

import structlog

from libs.domain.telemetry import TelemetryBatch
from libs.ownership import refuse_foreign
from libs.store import telemetry as telemetry_rows
from libs.store.eventstore import EventStore

log = structlog.get_logger(__name__)


class TelemetrySink:
    def __init__(self, store: EventStore) -> None:
        self.store = store

    async def handle(self, batch: TelemetryBatch) -> None:
        try:
            await self.write(batch)
        except Exception:  # a sample is a gap if lost, never a reason to stop receiving
            log.exception("telemetry_rejected", node_id=batch.node_id)

    async def write(self, batch: TelemetryBatch) -> None:
        """Write the samples of tasks placed on the sending node; drop and count the rest."""
        dropped = await telemetry_rows.write(self.store, batch)
        if dropped:
            refuse_foreign(
                "telemetry",
                "samples for tasks not placed on the sending node",
                count=len(dropped),
                node_id=batch.node_id,
                task_ids=dropped,
            )

    async def purge(self, days: float) -> int:
        return await telemetry_rows.purge(self.store, days)
