"""Telemetry sink: GPU samples from agents into `gpu_samples` (one row per task and card).

A card shared by several tasks is recorded for each with `shared_by`, so energy can be
apportioned later and marked as an estimate.
"""

from __future__ import annotations

import structlog

from libs.domain.telemetry import TelemetryBatch
from libs.store.eventstore import EventStore

log = structlog.get_logger(__name__)

INSERT = """
INSERT INTO gpu_samples (task_id, gpu_id, node_id, at, utilization_pct, memory_used_mb,
                         memory_total_mb, power_w, shared_by)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING
"""


class TelemetrySink:
    def __init__(self, store: EventStore) -> None:
        self.store = store

    async def handle(self, batch: TelemetryBatch) -> None:
        try:
            await self.write(batch)
        except Exception:  # a sample is a gap if lost, never a reason to stop receiving
            log.exception("telemetry_rejected", node_id=batch.node_id)

    async def write(self, batch: TelemetryBatch) -> None:
        rows = [
            (
                task_id,
                s.gpu_id,
                batch.node_id,
                s.at,
                s.utilization_pct,
                s.memory_used_mb,
                s.memory_total_mb,
                s.power_w,
                len(s.task_ids),
            )
            for s in batch.samples
            for task_id in s.task_ids
        ]
        if not rows:
            return
        async with self.store.pool.connection() as conn, conn.cursor() as cur:
            await cur.executemany(INSERT, rows)

    async def purge(self, days: float) -> int:
        async with self.store.pool.connection() as conn:
            cur = await conn.execute(
                "DELETE FROM gpu_samples WHERE at < now() - make_interval(days => %s)", (int(days),)
            )
            return cur.rowcount
