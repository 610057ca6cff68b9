"""The fault timeline end to end: one entry per real transition, after it committed, and
redelivery adds nothing."""

from __future__ import annotations

import asyncio
import json
from functools import partial

import nats
import psycopg
import pytest

from libs.bus.subjects import EVENTS_STREAM, event_subject
from tests.wait import wait_until_async

from . import web
from .cluster import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def timeline(cluster: Cluster, task_id: str) -> list[dict[str, object]]:
    r = web.get(f"{cluster.url}/api/v1/tasks/{task_id}/events", headers=cluster.tenant)
    assert r.status_code == 200, r.text
    return list(r.json()["events"])


async def republish(cluster: Cluster, stream_ids: list[str]) -> int:
    """Deliver the streams' events again, as a replaying operator or a redelivery would."""
    with psycopg.connect(cluster.database_url) as conn:
        rows = conn.execute(
            "SELECT event_id, position, stream_id, stream_type, version, type, schema_version,"
            " payload, occurred_at, metadata FROM events WHERE stream_id = ANY(%s)"
            " ORDER BY position",
            (stream_ids,),
        ).fetchall()
    nc = await nats.connect(cluster.nats.url)
    js = nc.jetstream()
    for r in rows:
        body = {
            "event_id": str(r[0]),
            "position": r[1],
            "stream_id": r[2],
            "stream_type": r[3],
            "version": r[4],
            "type": r[5],
            "schema_version": r[6],
            "payload": r[7],
            "occurred_at": r[8].isoformat(),
            "metadata": r[9],
        }
        # A fresh message id gets past JetStream's dedup: the consumer sees it twice.
        await js.publish(
            event_subject(r[3], r[2], r[5]),
            json.dumps(body).encode(),
            headers={"Nats-Msg-Id": f"{r[0]}:again"},
        )
    await nc.close()
    return len(rows)


TIMELINE_CONSUMER = "event-timeline"  # the event timeline's durable on HF_EVENTS


async def until_the_timeline_acked_everything(cluster: Cluster) -> None:
    """Wait until the timeline's durable consumer has acknowledged every event the stream
    holds now (an entry is written before its event is acked)."""
    nc = await nats.connect(cluster.nats.url)
    try:
        js = nc.jetstream()
        last: int = (await js.stream_info(EVENTS_STREAM)).state.last_seq

        async def acked() -> bool:
            info = await js.consumer_info(EVENTS_STREAM, TIMELINE_CONSUMER)
            return info.ack_floor is not None and info.ack_floor.stream_seq >= last

        await wait_until_async(acked, 30, 0.1, f"the timeline consumer acked through {last}")
    finally:
        await nc.close()


def has_migration_entry(cluster: Cluster, task_id: str) -> bool:
    return any(e["kind"] == "node_lost_migration" for e in timeline(cluster, task_id))


def test_agent_kill_gives_one_migration_entry_per_task(cluster: Cluster) -> None:
    cluster.start_agent("a", "process")
    tasks = [cluster.create(command="sleep 120", max_retries=0) for _ in range(2)]
    for t in tasks:
        cluster.wait_status(t["id"], "running")
    cluster.start_agent("b", "process")
    cluster.kill_agent("a")
    for t in tasks:
        cluster.wait(
            partial(has_migration_entry, cluster, t["id"]),
            "a migration entry",
            timeout=30,
        )
        # The entry is written after the transition committed: the task already shows it.
        assert "pending" in cluster.statuses(t["id"])[3:]
    before = {t["id"]: timeline(cluster, t["id"]) for t in tasks}
    for entries in before.values():
        assert [e["kind"] for e in entries].count("node_lost_migration") == 1
    assert asyncio.run(republish(cluster, [t["id"] for t in tasks])) > 0
    cluster.wait(
        lambda: all(cluster.task(t["id"])["status"] == "running" for t in tasks),
        "tasks running again",
    )
    # The barrier: the timeline's consumer has acknowledged every event up to the last
    # republished one, so whatever they would add is in by now.
    asyncio.run(until_the_timeline_acked_everything(cluster))
    after = {t["id"]: timeline(cluster, t["id"]) for t in tasks}
    assert after == before, "redelivered events added nothing"
