"""The `gpu_samples` table: NVML samples per task and card, written by the telemetry sink,
read by the gateway as time series and as power for energy.

Not a projection and not events: a sample written twice (same task, card and time) is kept
once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from libs.domain.energy import PowerSample
from libs.domain.telemetry import TelemetryBatch

from .eventstore import EventStore
from .pool import rows

INSERT = """
INSERT INTO gpu_samples (task_id, gpu_id, node_id, at, utilization_pct, memory_used_mb,
                         memory_total_mb, power_w, shared_by)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING
"""


@dataclass(frozen=True)
class GpuPoint:
    """One step of a card's series: averages (memory total: the maximum) over the step."""

    gpu_id: str
    t: datetime
    utilization_pct: float
    memory_used_mb: float
    memory_total_mb: float
    power_w: float | None


async def write(store: EventStore, batch: TelemetryBatch) -> list[str]:
    """One row per task and card of every sample; a card shared by several tasks is recorded
    for each with `shared_by`, so energy can be apportioned later.

    Only for tasks placed on the sending node (`batch.node_id`, which the sink has checked
    against the subject the agent may publish on): the ids of the others are returned, and
    nothing of theirs is written (nor counted in `shared_by`)."""
    named = sorted({t for s in batch.samples for t in s.task_ids})
    if not named:
        return []
    async with store.pool.connection() as conn, conn.cursor() as cur:
        await cur.execute(
            "SELECT id FROM tasks WHERE id = ANY(%s) AND node_id = %s", (named, batch.node_id)
        )
        placed = {r[0] for r in await cur.fetchall()}
        params = []
        for s in batch.samples:
            ours = [t for t in s.task_ids if t in placed]
            params += [
                (
                    task_id,
                    s.gpu_id,
                    batch.node_id,
                    s.at,
                    s.utilization_pct,
                    s.memory_used_mb,
                    s.memory_total_mb,
                    s.power_w,
                    len(ours),
                )
                for task_id in ours
            ]
        if params:
            await cur.executemany(INSERT, params)
    return [t for t in named if t not in placed]


async def purge(store: EventStore, days: float) -> int:
    """Delete samples older than `days` (whole days); how many went."""
    async with store.pool.connection() as conn:
        cur = await conn.execute(
            "DELETE FROM gpu_samples WHERE at < now() - make_interval(days => %s)", (int(days),)
        )
        return cur.rowcount


async def series(
    store: EventStore, task_id: str, start: datetime, end: datetime, step_s: int
) -> list[GpuPoint]:
    """A task's samples in [start, end) binned by `step_s` from `start`, by card then time."""
    found = await rows(
        store,
        "SELECT gpu_id, date_bin(make_interval(secs => %s), at, %s) AS t,"
        " avg(utilization_pct) AS utilization_pct, avg(memory_used_mb) AS memory_used_mb,"
        " max(memory_total_mb) AS memory_total_mb, avg(power_w) AS power_w"
        " FROM gpu_samples WHERE task_id = %s AND at >= %s AND at < %s"
        " GROUP BY gpu_id, t ORDER BY gpu_id, t",
        [step_s, start, task_id, start, end],
    )
    return [GpuPoint(**r) for r in found]


async def mean_utilization(
    store: EventStore, task_ids: Sequence[str], since: datetime
) -> float | None:
    """Mean GPU utilisation (%) over the cards of `task_ids` since `since`: each card's mean
    first, then the mean over cards (a card sampled more often does not weigh more). None
    when no card was sampled."""
    found = await rows(
        store,
        "SELECT avg(u) AS u FROM (SELECT avg(utilization_pct) AS u FROM gpu_samples"
        " WHERE task_id = ANY(%s) AND at >= %s GROUP BY node_id, gpu_id) AS cards",
        [list(task_ids), since],
    )
    value = found[0]["u"] if found else None
    return None if value is None else float(value)


async def power(store: EventStore, task_id: str) -> list[PowerSample]:
    """Every power reading of a task, oldest first, with how many tasks shared the card."""
    found = await rows(
        store,
        "SELECT gpu_id, at, power_w, shared_by FROM gpu_samples WHERE task_id = %s ORDER BY at",
        [task_id],
    )
    return [PowerSample(r["gpu_id"], r["at"], r["power_w"], r["shared_by"]) for r in found]
