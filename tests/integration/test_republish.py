"""Exactly once, end to end: republishing every event of a busy run through
`heteroflow events republish` changes no row in any table, and sends nothing to the DLQ.

JetStream drops a message whose id it saw within the stream's duplicate window (two minutes),
so a republish right after the run would never reach a consumer. The test shrinks the window
and lets it pass first: the republished events are then delivered like events older than two
minutes, and every consumer must recognise them by its receipts.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from functools import partial
from typing import Any

import psycopg
import pytest
from nats.js import JetStreamContext

from libs.bus.nats import connect
from libs.bus.subjects import DLQ_STREAM, EVENTS_STREAM, NODE_STREAM

from . import web
from .cluster import BIN, TERMINAL, Cluster, run_async

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TRANSIENT = "echo 'dial tcp 10.0.0.9:443: i/o timeout' >&2; exit 1"


def snapshot(database_url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, in a stable order."""
    with psycopg.connect(database_url) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables"
                " WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1"
            ).fetchall()
        ]
        return {
            t: sorted(
                (tuple(row) for row in conn.execute(f'SELECT * FROM "{t}"').fetchall()), key=repr
            )
            for t in tables
        }


async def consumers_idle(js: JetStreamContext) -> bool:
    """Nothing left to deliver, nothing unacknowledged, nothing waiting for redelivery (a
    nak'ed message waits out its delay; every delivery it had must have been acked)."""
    for stream in (EVENTS_STREAM, NODE_STREAM):
        for info in await js.consumers_info(stream):
            delivered = info.delivered.consumer_seq if info.delivered else 0
            acked = info.ack_floor.consumer_seq if info.ack_floor else 0
            if info.num_pending or info.num_ack_pending or info.num_redelivered:
                return False
            if delivered != acked:
                return False
    return True


async def stream_counts(js: JetStreamContext) -> dict[str, int]:
    return {s: (await js.stream_info(s)).state.messages for s in (EVENTS_STREAM, DLQ_STREAM)}


async def quiesce(cluster: Cluster, *, events_in_stream: int, within_s: float = 60.0) -> None:
    """Wait until the stream holds `events_in_stream` messages and every durable consumer has
    nothing pending and nothing unacknowledged, twice in a row."""
    nc = await connect(cluster.nats.url, "test-republish")
    js = nc.jetstream()
    deadline = time.monotonic() + within_s
    calm = 0
    try:
        while calm < 2:
            assert time.monotonic() < deadline, "consumers never went idle"
            counts = await stream_counts(js)
            busy = counts[EVENTS_STREAM] < events_in_stream or not await consumers_idle(js)
            calm = 0 if busy else calm + 1
            await asyncio.sleep(0.2)
    finally:
        await nc.close()


async def shrink_duplicate_window(cluster: Cluster, seconds: float) -> dict[str, int]:
    nc = await connect(cluster.nats.url, "test-republish")
    js = nc.jetstream()
    try:
        config = (await js.stream_info(EVENTS_STREAM)).config
        config.duplicate_window = seconds
        await js.update_stream(config)
        return await stream_counts(js)
    finally:
        await nc.close()


def event_count(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])  # type: ignore[index]


def decided(cluster: Cluster, task_id: str) -> int:
    with psycopg.connect(cluster.database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM events WHERE stream_id = %s AND type = 'task_retry_decided'",
            (task_id,),
        ).fetchone()
    return int(row[0]) if row else 0


def settled(cluster: Cluster, task_id: str) -> bool:
    task = cluster.task(task_id)
    if task["status"] == "failed":
        return decided(cluster, task_id) > int(task["retry_count"])
    return bool(task["status"] in TERMINAL)


def test_republishing_a_busy_run_changes_nothing(cluster: Cluster) -> None:
    cluster.start_agent("a", "process", HETEROFLOW_TELEMETRY_INTERVAL_S="3600")
    tasks = [cluster.create(command=f"echo done {i}") for i in range(6)]
    tasks += [cluster.create(command=TRANSIENT, max_retries=1, retry_delay=0) for _ in range(3)]
    tasks += [cluster.create(command="exit 3", retry_strategy="no_retry") for _ in range(2)]
    long = cluster.create(command="sleep 60")
    cluster.wait_status(long["id"], "running", timeout=60)
    r = web.post(f"{cluster.url}/api/v1/tasks/{long['id']}/stop", headers=cluster.tenant)
    assert r.status_code == 200, r.text
    for t in [*tasks, long]:
        cluster.wait(partial(settled, cluster, t["id"]), f"{t['id']} settled", timeout=90)
    statuses = {cluster.task(t["id"])["status"] for t in [*tasks, long]}
    assert {"completed", "failed", "stopped"} <= statuses

    events = event_count(cluster.database_url)
    run_async(quiesce(cluster, events_in_stream=events))
    before = snapshot(cluster.database_url)
    assert before["timeline"] and before["consumer_inbox"], "the run must give consumers work"

    # Let JetStream forget the message ids, so the republished events reach the consumers.
    counts = run_async(shrink_duplicate_window(cluster, 0.5))
    time.sleep(1.5)  # the window itself must pass: no assertion depends on this wait
    out = subprocess.run(
        [str(BIN), "events", "republish"],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert f"republished {events} event(s)" in out.stderr

    # Every republished event is in the stream again, and every consumer went through it.
    run_async(quiesce(cluster, events_in_stream=counts[EVENTS_STREAM] + events))
    after = snapshot(cluster.database_url)
    for table in before:
        assert after[table] == before[table], f"republish changed {table}"
    assert after.keys() == before.keys()
    nc_counts = run_async(_counts(cluster))
    assert nc_counts[DLQ_STREAM] == counts[DLQ_STREAM], "a consumer failed a republished event"


async def _counts(cluster: Cluster) -> dict[str, int]:
    nc = await connect(cluster.nats.url, "test-republish")
    try:
        return await stream_counts(nc.jetstream())
    finally:
        await nc.close()
