"""Outbox relay against a real PostgreSQL and a real JetStream.

Each test writes events under its own `stream_type`, so it reads back only its own messages
from the session-wide HF_EVENTS stream.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig
from prometheus_client import REGISTRY
from psycopg.types.json import Jsonb

from libs.bus import subjects as s
from libs.bus.nats import connect, ensure_durable_consumer, ensure_streams
from libs.domain.envelope import EventEnvelope
from libs.store.migrations import migrate
from libs.store.relay import OutboxEvent, OutboxRelay, RelayPublishError, in_stream_order

pytestmark = pytest.mark.integration


@pytest.fixture
def db(database_url: str) -> str:
    with psycopg.connect(database_url) as conn:
        migrate(conn)
    return database_url


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    client = await connect(nats_url, "test-relay")
    await ensure_streams(client.jetstream())
    yield client
    await client.close()


@pytest.fixture
def js(nc: Client) -> JetStreamContext:
    return nc.jetstream()


@pytest.fixture
def stream_type() -> str:
    return "t" + uuid.uuid4().hex[:10]


def insert(conn: psycopg.Connection[Any], stream_type: str, stream_id: str, version: int) -> str:
    event_id = str(uuid.uuid4())
    conn.execute(
        "INSERT INTO events (event_id, stream_id, stream_type, version, type, payload,"
        " occurred_at) VALUES (%s, %s, %s, %s, %s, %s, now())",
        (event_id, stream_id, stream_type, version, "thing_happened", Jsonb({"n": version})),
    )
    return event_id


def insert_committed(
    db: str, stream_type: str, stream_id: str, versions: Sequence[int]
) -> list[str]:
    with psycopg.connect(db) as conn:
        return [insert(conn, stream_type, stream_id, v) for v in versions]


async def stored(js: JetStreamContext, stream_type: str) -> list[Msg]:
    """Every message HF_EVENTS holds for `stream_type`, in stream order."""
    config = ConsumerConfig(inactive_threshold=10.0)
    sub = await js.pull_subscribe(
        s.event_filter(stream_type), stream=s.EVENTS_STREAM, config=config
    )
    msgs: list[Msg] = []
    while (await sub.consumer_info()).num_pending:
        msgs.extend(await sub.fetch(1000, timeout=1.0))
    await sub.unsubscribe()
    return msgs


def msg_ids(msgs: Sequence[Msg]) -> list[str]:
    return [(m.headers or {})[s.HDR_MSG_ID] for m in msgs]


def published_total(name: str) -> float:
    value = REGISTRY.get_sample_value("heteroflow_relay_published_events_total", {"relay": name})
    return value or 0.0


async def test_every_committed_event_is_published_once(
    db: str, js: JetStreamContext, stream_type: str
) -> None:
    ids = insert_committed(db, stream_type, "task-a", [1, 2, 3])
    ids += insert_committed(db, stream_type, "task-b", [1, 2])
    name = "r-" + stream_type
    async with OutboxRelay(db, js, name=name, batch_size=2) as relay:
        assert await relay.run_once() == 5
        assert await relay.run_once() == 0
    assert published_total(name) == 5
    assert REGISTRY.get_sample_value("heteroflow_relay_lag_events", {"relay": name}) == 0

    msgs = await stored(js, stream_type)
    assert msg_ids(msgs) == ids
    first = msgs[0]
    assert first.subject == s.event_subject(stream_type, "task-a", "thing_happened")
    assert first.headers is not None
    assert first.headers[s.HDR_STREAM_ID] == "task-a"
    assert first.headers[s.HDR_VERSION] == "1"
    assert first.headers[s.HDR_EVENT_TYPE] == "thing_happened"
    body = json.loads(first.data)
    assert body["event_id"] == ids[0]
    assert body["payload"] == {"n": 1}
    assert body["schema_version"] == 1
    assert first.headers[s.HDR_POSITION] == str(body["position"])
    assert set(body) == {
        "event_id", "position", "stream_id", "stream_type", "version", "type",
        "schema_version", "occurred_at", "payload", "metadata",
    }  # fmt: skip


async def test_the_message_is_the_stored_event_as_its_envelope(
    db: str, js: JetStreamContext, stream_type: str
) -> None:
    """The body PostgreSQL writes for the relay parses as the envelope of the stored row:
    nested payload values, text needing escapes, floats, metadata and the time all intact."""
    payload = {"f": 0.1, "big": 2**53 + 1, "s": 'é "q" \\ \n', "nested": {"a": [1, None, True]}}
    metadata = {"node_id": "n-1", "fact": "running"}
    at = datetime(2026, 12, 2, 13, 5, 7, 123456, tzinfo=UTC)
    with psycopg.connect(db) as conn:
        event_id = str(uuid.uuid4())
        conn.execute(
            "INSERT INTO events (event_id, stream_id, stream_type, version, type,"
            " schema_version, payload, metadata, occurred_at)"
            " VALUES (%s, 'task-x', %s, 1, 'thing_happened', 3, %s, %s, %s)",
            (event_id, stream_type, Jsonb(payload), Jsonb(metadata), at),
        )
    async with OutboxRelay(db, js, name="r-" + stream_type) as relay:
        assert await relay.run_once() == 1
    (msg,) = await stored(js, stream_type)
    got = EventEnvelope.model_validate_json(msg.data)
    assert (str(got.event_id), got.stream_id, got.stream_type) == (event_id, "task-x", stream_type)
    assert (got.version, got.type, got.schema_version) == (1, "thing_happened", 3)
    assert (got.payload, got.metadata, got.occurred_at) == (payload, metadata, at)
    assert msg.headers is not None and msg.headers[s.HDR_POSITION] == str(got.position)


async def test_a_new_relay_resumes_from_the_checkpoint(
    db: str, js: JetStreamContext, stream_type: str
) -> None:
    first = insert_committed(db, stream_type, "task-a", [1, 2, 3])
    async with OutboxRelay(db, js, name="main") as relay:
        assert await relay.run_once() == 3
    later = insert_committed(db, stream_type, "task-a", [4, 5])
    async with OutboxRelay(db, js, name="main") as relay:
        assert await relay.run_once() == 2  # only the new ones
    assert msg_ids(await stored(js, stream_type)) == first + later


async def test_transaction_ids_of_different_lengths_are_taken_in_numeric_order(
    db: str, js: JetStreamContext, stream_type: str
) -> None:
    """A batch spanning 99 -> 100 (as every installation's ids cross 999 -> 1000 early):
    taken in text order, '100' came before '99', the checkpoint passed the 99s and they were
    never published."""
    ids = []
    with psycopg.connect(db) as conn:
        for tx_id, stream_id in ((99, "task-a"), (99, "task-b"), (100, "task-c")):
            event_id = str(uuid.uuid4())
            conn.execute(
                "INSERT INTO events (event_id, stream_id, stream_type, version, type, payload,"
                " occurred_at, tx_id) VALUES (%s, %s, %s, 1, 'thing_happened', '{}', now(),"
                " %s::text::xid8)",
                (event_id, stream_id, stream_type, str(tx_id)),
            )
            ids.append(event_id)
    async with OutboxRelay(db, js, name="digits", batch_size=1) as relay:
        assert await relay.run_once() == 3
    assert msg_ids(await stored(js, stream_type)) == ids


class CrashBeforeCheckpoint(OutboxRelay):
    async def _after_publish(self, events: Sequence[OutboxEvent]) -> None:
        raise RuntimeError("crash between the acks and the checkpoint write")


async def test_crash_before_checkpoint_republishes_and_the_stream_dedups(
    db: str, js: JetStreamContext, stream_type: str
) -> None:
    ids = insert_committed(db, stream_type, "task-a", [1, 2, 3, 4])
    durable = "d" + stream_type
    await ensure_durable_consumer(js, s.EVENTS_STREAM, durable, s.event_filter(stream_type), 5, 3)

    async with CrashBeforeCheckpoint(db, js, name="main") as crashing:
        with pytest.raises(RuntimeError, match="crash"):
            await crashing.run_once()
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM relay_checkpoints").fetchone() == (0,)

    async with OutboxRelay(db, js, name="main") as relay:
        assert await relay.run_once() == 4  # published again ...
    assert msg_ids(await stored(js, stream_type)) == ids  # ... but stored once

    sub = await js.pull_subscribe_bind(durable, s.EVENTS_STREAM)
    seen = []
    for msg in await sub.fetch(100, timeout=1.0):
        seen.append(msg_ids([msg])[0])
        await msg.ack()
    assert seen == ids
    assert (await js.consumer_info(s.EVENTS_STREAM, durable)).num_pending == 0
    await js.delete_consumer(s.EVENTS_STREAM, durable)


async def test_an_earlier_insert_committing_late_is_not_skipped(
    db: str, js: JetStreamContext, stream_type: str
) -> None:
    # A inserts first (lower position) but commits after B: a position cursor would skip A.
    async with OutboxRelay(db, js, name="main") as relay:
        with psycopg.connect(db) as a, psycopg.connect(db) as b:
            id_a = insert(a, stream_type, "task-a", 1)
            id_b = insert(b, stream_type, "task-b", 1)
            b.commit()
            assert await relay.run_once() == 0  # B waits behind the running A
            a.commit()
        assert await relay.run_once() == 2
    assert msg_ids(await stored(js, stream_type)) == [id_a, id_b]


async def test_an_older_transaction_committing_last_is_not_skipped(
    db: str, js: JetStreamContext, stream_type: str
) -> None:
    # A takes its transaction id first, B inserts and commits, then A inserts (a higher
    # position than B's) and commits: A is still delivered, and first (commit-final order).
    async with OutboxRelay(db, js, name="main") as relay:
        with psycopg.connect(db) as a, psycopg.connect(db) as b:
            a.execute("SELECT pg_current_xact_id()")
            id_b = insert(b, stream_type, "task-b", 1)
            b.commit()
            assert await relay.run_once() == 0
            id_a = insert(a, stream_type, "task-a", 1)
            a.commit()
        assert await relay.run_once() == 2
        assert await relay.run_once() == 0
    assert msg_ids(await stored(js, stream_type)) == [id_a, id_b]


async def test_an_unacknowledged_publish_does_not_move_the_checkpoint(
    db: str, js: JetStreamContext, stream_type: str
) -> None:
    ids = insert_committed(db, stream_type, "task-a", [1, 2])
    # JetStream refuses a publish whose expected stream is not the one holding the subject.
    failing = OutboxRelay(db, js, name="main", expected_stream="HF_NOWHERE", publish_timeout=0.5)
    async with failing:
        with pytest.raises(RelayPublishError):
            await failing.run_once()
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM relay_checkpoints").fetchone() == (0,)
    async with OutboxRelay(db, js, name="main") as relay:
        assert await relay.run_once() == 2
    assert msg_ids(await stored(js, stream_type)) == ids


async def test_a_message_lost_inside_a_pipeline_lets_no_later_one_ahead_of_it(
    db: str, nc: Client, js: JetStreamContext, stream_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server the relay is connected to dies holding one pipelined message; the client
    sends the later ones to the next server. Stored, they would be ahead of the lost one,
    which the retry would append after them."""
    ids = insert_committed(db, stream_type, "task-a", range(1, 31))
    lost = {ids[10]}
    real = nc.publish

    async def publish(
        subject: str, payload: bytes = b"", reply: str = "", headers: dict[str, str] | None = None
    ) -> None:
        msg_id = (headers or {}).get(s.HDR_MSG_ID)
        if msg_id in lost:
            lost.discard(msg_id)  # gone with the server, no answer ever comes
            return
        await real(subject, payload, reply=reply, headers=headers)

    monkeypatch.setattr(nc, "publish", publish)
    async with OutboxRelay(db, js, name="r-" + stream_type, publish_timeout=1.0) as relay:
        # After the lost one's ack timed out it goes alone, then the rest again, in one round.
        assert await relay.run_once() >= 30
    assert not lost
    assert msg_ids(await stored(js, stream_type)) == ids


async def test_run_is_woken_by_notify_and_stops(
    db: str, js: JetStreamContext, stream_type: str
) -> None:
    # A poll far longer than the test: only LISTEN/NOTIFY can deliver the event in time.
    relay = OutboxRelay(db, js, name="main", poll_interval=30.0)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    await until_round(relay)  # it listens and has drained the store once
    ids = insert_committed(db, stream_type, "task-a", [1])
    for _ in range(40):
        if await stored(js, stream_type):
            break
        await asyncio.sleep(0.05)
    assert msg_ids(await stored(js, stream_type)) == ids
    stop.set()
    await asyncio.wait_for(task, 2.0)  # without waiting out the poll
    assert relay.checkpoint is None  # closed its connections


async def test_versions_of_one_stream_go_out_in_order_when_tx_ids_disagree(
    db: str, js: JetStreamContext, stream_type: str
) -> None:
    # A takes its id first by writing another stream; B commits version 1 of task-x; A then
    # appends version 2 of task-x. By (tx_id, position) A's rows come first; by version, no.
    async with OutboxRelay(db, js, name="main") as relay:
        with psycopg.connect(db) as a, psycopg.connect(db) as b:
            insert(a, stream_type, "task-y", 1)
            x1 = insert(b, stream_type, "task-x", 1)
            b.commit()
            x2 = insert(a, stream_type, "task-x", 2)
            a.commit()
        assert await relay.run_once() == 3
    x_msgs = [m for m in await stored(js, stream_type) if ".task-x." in m.subject]
    assert msg_ids(x_msgs) == [x1, x2]


async def until_round(relay: OutboxRelay, within_s: float = 5.0) -> None:
    """Until `relay.run` has listened and finished a first round (its checkpoint is loaded)."""
    deadline = time.monotonic() + within_s
    while relay.checkpoint is None:
        assert time.monotonic() < deadline, "the relay never completed a round"
        await asyncio.sleep(0.02)


def event(stream_id: str, version: int, position: int) -> OutboxEvent:
    return OutboxEvent(
        position=position,
        event_id=uuid.uuid4(),
        stream_id=stream_id,
        stream_type="task",
        version=version,
        type="t",
        payload={},
        occurred_at=datetime.now(UTC),
        tx_id="1",
    )


def test_in_stream_order_keeps_slots_and_sorts_each_stream() -> None:
    rows = [event("y", 1, 5), event("x", 2, 6), event("z", 7, 7), event("x", 1, 4)]
    got = [(e.stream_id, e.version) for e in in_stream_order(rows)]
    assert got == [("y", 1), ("x", 1), ("z", 7), ("x", 2)]


class Recording(OutboxRelay):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.published: list[str] = []

    async def _after_publish(self, events: Sequence[OutboxEvent]) -> None:
        self.published.extend(str(e.event_id) for e in events)


async def wait_stored(js: JetStreamContext, stream_type: str, count: int) -> list[str]:
    for _ in range(60):
        ids = msg_ids(await stored(js, stream_type))
        if len(ids) >= count:
            return ids
        await asyncio.sleep(0.05)
    return msg_ids(await stored(js, stream_type))


async def test_a_second_relay_waits_as_standby_and_takes_over(
    db: str, js: JetStreamContext, stream_type: str
) -> None:
    active, standby = Recording(db, js, name="main"), Recording(db, js, name="main")
    stops = asyncio.Event(), asyncio.Event()
    first = asyncio.create_task(active.run(stops[0]))
    await until_round(active)  # it holds the lock before the standby asks
    second = asyncio.create_task(standby.run(stops[1]))
    ids = insert_committed(db, stream_type, "task-a", [1, 2])
    assert await wait_stored(js, stream_type, 2) == ids
    assert active.published == ids and standby.published == []

    stops[0].set()  # the active one stops: its session, and so its lock, ends
    await asyncio.wait_for(first, 2.0)
    later = insert_committed(db, stream_type, "task-a", [3])
    assert await wait_stored(js, stream_type, 3) == ids + later
    assert standby.published == later
    stops[1].set()
    await asyncio.wait_for(second, 2.0)


# --- no poison pills ------------------------------------------------------------------------


def insert_sized(db: str, stream_type: str, stream_id: str, version: int, size: int) -> str:
    """An event whose payload alone is about `size` bytes (as the gateway could once write)."""
    event_id = str(uuid.uuid4())
    with psycopg.connect(db) as conn:
        conn.execute(
            "INSERT INTO events (event_id, stream_id, stream_type, version, type, payload,"
            " occurred_at) VALUES (%s, %s, %s, %s, %s, %s, now())",
            (event_id, stream_id, stream_type, version, "thing_happened", Jsonb({"x": "y" * size})),
        )
    return event_id


def dead_letters(db: str, relay: str) -> list[tuple[str, str]]:
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT event_id::text, error FROM relay_dead_letters WHERE relay = %s"
            " ORDER BY position",
            (relay,),
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


def metric(name: str, relay: str) -> float:
    return REGISTRY.get_sample_value(name, {"relay": relay}) or 0.0


async def test_an_event_over_max_payload_is_dead_lettered_and_the_others_go_out(
    db: str, nc: Client, js: JetStreamContext, stream_type: str
) -> None:
    name = "r-" + stream_type
    before = insert_committed(db, stream_type, "task-a", [1])
    # Over the server's max_payload by its headers alone: the server would close the
    # connection for it rather than answer, again and again.
    body_only = nc.max_payload - 150
    poisoned = insert_sized(db, stream_type, "task-b", 1, body_only)
    huge = insert_sized(db, stream_type, "task-c", 1, nc.max_payload + 1)
    after = insert_committed(db, stream_type, "task-d", [1, 2])  # another tenant's work
    async with OutboxRelay(db, js, name=name) as relay:
        assert await relay.run_once() == 3
        assert await relay.run_once() == 0
    assert [e for e, _ in dead_letters(db, name)] == [poisoned, huge]
    assert all("max_payload" in error for _, error in dead_letters(db, name))
    assert metric("heteroflow_relay_dead_letters_total", name) == 2
    assert metric("heteroflow_relay_lag_events", name) == 0
    assert msg_ids(await stored(js, stream_type)) == before + after
    assert nc.is_connected


async def test_an_event_the_stream_refuses_is_dead_lettered(
    db: str, js: JetStreamContext, stream_type: str
) -> None:
    name = "r-" + stream_type
    info = await js.stream_info(s.EVENTS_STREAM)
    config = info.config
    limited = replace(config, max_msg_size=64 * 1024)
    refused = insert_sized(db, stream_type, "task-a", 1, 100 * 1024)
    after = insert_committed(db, stream_type, "task-b", [1])
    await js.update_stream(limited)
    try:
        async with OutboxRelay(db, js, name=name, publish_timeout=1.0) as relay:
            assert await relay.run_once() == 1
    finally:
        await js.update_stream(config)
    [(event_id, error)] = dead_letters(db, name)
    assert event_id == refused and "err_code=10054" in error
    assert msg_ids(await stored(js, stream_type)) == after


async def test_a_stream_wide_refusal_is_not_a_dead_letter_and_the_lag_tells_the_truth(
    db: str, js: JetStreamContext, stream_type: str
) -> None:
    name = "r-" + stream_type
    async with OutboxRelay(db, js, name=name) as relay:
        await relay.run_once()  # catch up with what earlier tests left
    insert_committed(db, stream_type, "task-a", [1, 2, 3])
    failing = OutboxRelay(
        db, js, name=name, expected_stream="HF_NOWHERE", publish_timeout=0.3, max_backoff=0.3
    )
    stop = asyncio.Event()
    task = asyncio.create_task(failing.run(stop))
    try:
        for _ in range(100):  # a deadline of 10 s, polled
            if metric("heteroflow_relay_lag_events", name) == 3:
                break
            await asyncio.sleep(0.1)
        assert metric("heteroflow_relay_lag_events", name) == 3
        assert metric("heteroflow_relay_failures_total", name) >= 1
    finally:
        stop.set()
        await asyncio.wait_for(task, 5.0)
    assert dead_letters(db, name) == []
