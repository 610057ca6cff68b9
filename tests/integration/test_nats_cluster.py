"""A three-server JetStream cluster (pip's nats-server, no Docker): streams are declared with
HETEROFLOW_NATS_REPLICAS=3, and the outbox relay keeps publishing when the server it is
connected to is SIGKILLed; the stream ends up holding every committed event once, in order."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig
from nats.js.errors import APIError
from psycopg.types.json import Jsonb

from libs.bus import subjects as s
from libs.bus.lease import open_lease_bucket
from libs.bus.nats import connect, ensure_streams
from libs.store.migrations import migrate
from libs.store.relay import OutboxRelay
from tests.wait import wait_until_async

from .nats_cluster import NatsCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DEADLINE_S = 30.0


@pytest.fixture
def cluster(hf_tmp: Path) -> Iterator[NatsCluster]:
    nats = NatsCluster(hf_tmp / ("cluster-" + uuid.uuid4().hex[:6])).start()
    yield nats
    nats.stop()


@pytest.fixture
async def nc(cluster: NatsCluster, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Client]:
    monkeypatch.setenv("HETEROFLOW_NATS_REPLICAS", "3")
    client = await connect(cluster.url, "test-cluster-relay", connect_timeout=2)
    js = client.jetstream()

    async def declared() -> bool:
        # The cluster elects its JetStream meta leader a few seconds after the routes form.
        try:
            await ensure_streams(js)
            return True
        except Exception:  # noqa: BLE001 - "no meta leader yet" comes as several errors
            return False

    await wait_until_async(declared, DEADLINE_S, 0.2, "the streams are declared")
    yield client
    await client.close()


def insert_events(db: str, stream_type: str, first: int, count: int) -> list[str]:
    ids = [str(uuid.uuid4()) for _ in range(count)]
    with psycopg.connect(db) as conn:
        for n, event_id in enumerate(ids, start=first):
            conn.execute(
                "INSERT INTO events (event_id, stream_id, stream_type, version, type, payload,"
                " occurred_at) VALUES (%s, %s, %s, %s, %s, %s, now())",
                (event_id, "s-1", stream_type, n, "thing_happened", Jsonb({"n": n})),
            )
    return ids


async def stored_ids(js: JetStreamContext, stream_type: str) -> list[str]:
    sub = await js.pull_subscribe(
        s.event_filter(stream_type),
        stream=s.EVENTS_STREAM,
        config=ConsumerConfig(inactive_threshold=10.0),
    )
    ids: list[str] = []
    while (await sub.consumer_info()).num_pending:
        ids.extend((m.headers or {})[s.HDR_MSG_ID] for m in await sub.fetch(500, timeout=2.0))
    await sub.unsubscribe()
    return ids


async def test_streams_and_lease_bucket_have_three_replicas(nc: Client) -> None:
    js = nc.jetstream()
    info = await js.stream_info(s.EVENTS_STREAM)
    assert info.config.num_replicas == 3
    assert info.cluster is not None and len(info.cluster.replicas or []) == 2
    bucket = "hf_lease_" + uuid.uuid4().hex[:6]
    await open_lease_bucket(js, 5.0, bucket=bucket)
    assert (await js.stream_info(f"KV_{bucket}")).config.num_replicas == 3


async def test_relay_keeps_publishing_when_a_server_is_killed(
    database_url: str, nc: Client, cluster: NatsCluster
) -> None:
    with psycopg.connect(database_url) as conn:
        migrate(conn)
    js = nc.jetstream()
    stream_type = "t" + uuid.uuid4().hex[:10]
    ids = insert_events(database_url, stream_type, 1, 100)
    stop = asyncio.Event()
    async with OutboxRelay(database_url, js, name="r-" + stream_type, max_backoff=1.0) as relay:
        running = asyncio.create_task(relay.run(stop))
        try:

            async def first_batch() -> bool:
                return len(await stored_ids(js, stream_type)) == 100

            await wait_until_async(
                first_batch, DEADLINE_S, 0.2, "the first 100 events are in the stream"
            )
            victim = cluster.by_url(str(nc.connected_url.geturl() if nc.connected_url else ""))
            victim.kill()
            # Committed while the client reconnects and the stream may elect a new leader.
            for k in range(4):
                ids += insert_events(database_url, stream_type, 101 + 50 * k, 50)
                await asyncio.sleep(0.1)

            async def everything() -> bool:
                try:
                    return len(await stored_ids(js, stream_type)) >= len(ids)
                except (NatsTimeoutError, APIError):
                    return False  # this reader's own requests during the failover

            await wait_until_async(everything, DEADLINE_S, 0.2, "all 300 events are in the stream")
        finally:
            stop.set()
            await running
    assert nc.connected_url is not None and nc.connected_url.port != victim.port
    stored: list[str] = []

    async def read_back() -> bool:
        # This reader's own requests may still time out while the cluster settles.
        nonlocal stored
        try:
            stored = await stored_ids(js, stream_type)
        except (NatsTimeoutError, APIError):
            return False
        return True

    await wait_until_async(read_back, DEADLINE_S, 0.2, "the stream read back")
    assert stored == ids
    info = await js.stream_info(s.EVENTS_STREAM)
    assert info.cluster is not None
    lost = [r for r in info.cluster.replicas or [] if not r.current or r.offline]
    assert len(lost) == 1  # the killed server; the leader and one follower hold the stream
