"""The `gpu_samples` table: NVML samples per task and card, written by the telemetry sink,
read by the gateway as time series and as power for energy.

Not a projection and not events: a sample written twice (same task, card and time) is kept
once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from libs.domain.task.energy import PowerSample
from libs.domain.telemetry import TelemetryBatch

from .eventstore import EventStore
from .pool import rows

# One statement per batch: the samples' rows for tasks placed on the sending node are
# written (`shared_by`: how many of those share the card in that sample), and the ids of the
# tasks named but not placed there come back.
WRITE = """
WITH sample AS (
    SELECT * FROM unnest(%(n)s::int[], %(task_id)s::text[], %(gpu_id)s::text[],
                         %(at)s::timestamptz[], %(util)s::real[], %(used)s::real[],
                         %(total)s::real[], %(power)s::real[])
        AS s(n, task_id, gpu_id, at, utilization_pct, memory_used_mb, memory_total_mb, power_w)
), placed AS (
    SELECT sample.* FROM sample JOIN tasks ON tasks.id = sample.task_id
    WHERE tasks.node_id = %(node_id)s
), written AS (
    INSERT INTO gpu_samples (task_id, gpu_id, node_id, at, utilization_pct, memory_used_mb,
                             memory_total_mb, power_w, shared_by)
    SELECT task_id, gpu_id, %(node_id)s, at, utilization_pct, memory_used_mb,
           memory_total_mb, power_w, count(*) OVER (PARTITION BY n)
    FROM placed
    ON CONFLICT DO NOTHING
)
SELECT DISTINCT task_id FROM sample
WHERE task_id NOT IN (SELECT task_id FROM placed) ORDER BY task_id
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
    nothing of theirs is written (nor counted in `shared_by`). One statement (`WRITE`)."""
    rows_of = [(n, s, t) for n, s in enumerate(batch.samples) for t in s.task_ids]
    if not rows_of:
        return []
    params = {
        "n": [n for n, _, _ in rows_of],
        "task_id": [t for _, _, t in rows_of],
        "gpu_id": [s.gpu_id for _, s, _ in rows_of],
        "at": [s.at for _, s, _ in rows_of],
        "util": [s.utilization_pct for _, s, _ in rows_of],
        "used": [s.memory_used_mb for _, s, _ in rows_of],
        "total": [s.memory_total_mb for _, s, _ in rows_of],
        "power": [s.power_w for _, s, _ in rows_of],
        "node_id": batch.node_id,
    }
    async with store.pool.connection() as conn, conn.cursor() as cur:
        await cur.execute(WRITE, params)
        return [r[0] for r in await cur.fetchall()]


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
