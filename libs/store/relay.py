"""The outbox relay: publishes committed events from PostgreSQL to JetStream, never skipping
one, at least once, resuming from a checkpoint after any crash.

Why (tx_id, position) and not position alone: a bigserial is drawn at insert time, not at
commit, so a transaction that inserted position 10 may commit after the one that inserted 11.
A reader that remembered "last position = 11" would skip 10 for ever. Instead the relay reads
only rows written by transactions older than the oldest one still running (``tx_id <
pg_snapshot_xmin(pg_current_snapshot())``): every such transaction has ended, so nothing can
still appear below that line, and any transaction still able to commit has a tx_id at or above
it, i.e. after the checkpoint. Rows are taken in (tx_id, position) order, and each batch is
re-sorted so that every stream's events go out in version order (`in_stream_order`).
The price: one long-running writing transaction, on any table, holds the relay back until it
ends; its end sends no NOTIFY, hence the poll.

Delivery: each event is published with ``Nats-Msg-Id`` = event_id; the checkpoint moves only
past events whose publish JetStream acknowledged. A crash between the ack and the checkpoint
write republishes a batch, which JetStream drops as duplicates inside its window (2 minutes);
past the window consumers see it twice, so they are idempotent (see docs/events.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
import structlog
from nats.js import JetStreamContext
from nats.js.api import PubAck
from prometheus_client import Counter, Gauge
from psycopg.rows import class_row

from libs.bus import subjects as s
from libs.bus.broker import Routes
from libs.domain.envelope import EventEnvelope

log = structlog.get_logger(__name__)

PUBLISHED = Counter(
    "heteroflow_relay_published_events", "Events acknowledged by JetStream", ["relay"]
)
FAILURES = Counter(
    "heteroflow_relay_failures", "Relay rounds that failed and backed off", ["relay"]
)
LAG = Gauge(
    "heteroflow_relay_lag_events",
    "Highest event position in the store minus the relay checkpoint position",
    ["relay"],
)

_NOTIFY_CHANNEL = "hf_events"

_SELECT = """
SELECT position, event_id, stream_id, stream_type, version, type, schema_version,
       payload, metadata, occurred_at, tx_id::text AS tx_id
FROM events
WHERE (tx_id, position) > (%(tx)s::xid8, %(pos)s)
  AND tx_id < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY tx_id, position
LIMIT %(limit)s
"""

# Monotonic: a stale relay instance finishing late cannot move the checkpoint backwards.
_SAVE_CHECKPOINT = """
INSERT INTO relay_checkpoints (name, tx_id, position, updated_at)
VALUES (%(name)s, %(tx)s::xid8, %(pos)s, now())
ON CONFLICT (name) DO UPDATE
SET tx_id = EXCLUDED.tx_id, position = EXCLUDED.position, updated_at = EXCLUDED.updated_at
WHERE (relay_checkpoints.tx_id, relay_checkpoints.position) < (EXCLUDED.tx_id, EXCLUDED.position)
"""


@dataclass(frozen=True)
class Checkpoint:
    tx_id: int
    position: int


@dataclass(frozen=True)
class OutboxEvent:
    """One row of `events` as the relay reads it."""

    position: int
    event_id: UUID
    stream_id: str
    stream_type: str
    version: int
    type: str
    schema_version: int
    payload: Any
    metadata: Any
    occurred_at: datetime
    tx_id: str

    @property
    def checkpoint(self) -> Checkpoint:
        return Checkpoint(int(self.tx_id), self.position)


def subject_of(event: OutboxEvent) -> str:
    return s.event_subject(event.stream_type, event.stream_id, event.type)


def headers_of(event: OutboxEvent) -> dict[str, str]:
    return {
        s.HDR_MSG_ID: str(event.event_id),
        s.HDR_EVENT_TYPE: event.type,
        s.HDR_STREAM_ID: event.stream_id,
        s.HDR_VERSION: str(event.version),
        s.HDR_POSITION: str(event.position),
    }


def envelope_of(event: OutboxEvent) -> bytes:
    """The message body: the event with its store metadata (`EventEnvelope`), compact JSON."""
    # model_construct: the row comes from our own table, validating it again costs throughput.
    return EventEnvelope.model_construct(
        event_id=event.event_id,
        position=event.position,
        stream_id=event.stream_id,
        stream_type=event.stream_type,
        version=event.version,
        type=event.type,
        schema_version=event.schema_version,
        occurred_at=event.occurred_at,
        payload=event.payload,
        metadata=event.metadata,
    ).body()


def routes() -> Routes:
    """What the relay publishes, declared for the AsyncAPI document.

    The relay itself stays on nats-py: it needs `publish_async` (pipelined publishes whose
    acks it awaits as a prefix, with a stall bound) to move its checkpoint only past
    acknowledged events, which FastStream's publisher does not offer.
    """
    r = Routes("outbox-relay")
    r.publishes(
        EventEnvelope,
        subject=f"{s.EVENTS_PREFIX}.{{stream_type}}.{{stream_id}}.{{event_type}}",
        description=f"Committed domain events, Nats-Msg-Id = event id (stream {s.EVENTS_STREAM}).",
    )
    return r


def in_stream_order(events: Sequence[OutboxEvent]) -> list[OutboxEvent]:
    """`events` with each stream's events put back in version order, in the same slots.

    (tx_id, position) order can invert two versions of one stream: a transaction that took
    its id early (it wrote another stream first) may append version n+1 after a younger
    transaction committed version n. Both are final by the time either is read, so they
    arrive in one batch unless a backlog cuts it between them.
    """
    queues: dict[str, deque[OutboxEvent]] = {}
    for event in sorted(events, key=lambda e: e.version):
        queues.setdefault(event.stream_id, deque()).append(event)
    return [queues[event.stream_id].popleft() for event in events]


class RelayPublishError(RuntimeError):
    """Some events of a batch were not acknowledged; the checkpoint stayed before them."""


class OutboxRelay:
    """Publishes committed events to JetStream; see the module docstring for the guarantees.

    `run_once` drains what is publishable now; `run` loops until `stop` is set, woken by
    LISTEN/NOTIFY with a poll fallback, backing off on failures. With `single_active`, `run`
    holds a PostgreSQL advisory lock per relay name, so extra replicas wait as standbys.
    """

    def __init__(
        self,
        database_url: str,
        js: JetStreamContext,
        *,
        name: str = "outbox",
        batch_size: int = 500,
        poll_interval: float = 0.2,
        publish_timeout: float = 5.0,
        max_backoff: float = 5.0,
        single_active: bool = True,
        expected_stream: str | None = s.EVENTS_STREAM,
    ) -> None:
        self.database_url = database_url
        self.js = js
        self.name = name
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.publish_timeout = publish_timeout
        self.max_backoff = max_backoff
        self.single_active = single_active
        self.expected_stream = expected_stream
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._listen: psycopg.AsyncConnection[Any] | None = None
        self._checkpoint: Checkpoint | None = None
        self._locked = False

    @property
    def checkpoint(self) -> Checkpoint | None:
        """The last checkpoint loaded or written (None before the first round)."""
        return self._checkpoint

    async def __aenter__(self) -> OutboxRelay:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for conn in (self._conn, self._listen):
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()
        self._conn = self._listen = None
        self._checkpoint = None
        self._locked = False

    # --- one round ----------------------------------------------------------------------

    async def run_once(self) -> int:
        """Publish every event committed so far; return how many were acknowledged."""
        conn = await self._connection()
        if self._checkpoint is None:
            self._checkpoint = await self._load_checkpoint(conn)
        total = 0
        while True:
            published = await self._relay_batch(conn)
            total += published
            if published < self.batch_size:
                break
        await self._update_lag(conn)
        return total

    async def _relay_batch(self, conn: psycopg.AsyncConnection[Any]) -> int:
        assert self._checkpoint is not None
        cp = self._checkpoint
        async with conn.cursor(row_factory=class_row(OutboxEvent)) as cur:
            await cur.execute(
                _SELECT, {"tx": str(cp.tx_id), "pos": cp.position, "limit": self.batch_size}
            )
            events = await cur.fetchall()
        if not events:
            return 0
        order = in_stream_order(events)
        acked = await self._publish(order)
        if acked:
            done = {e.event_id for e in order[:acked]}
            # The checkpoint covers the longest run, in (tx_id, position) order, of acked events.
            upto = next((i for i, e in enumerate(events) if e.event_id not in done), len(events))
            await self._after_publish(order[:acked])
            if upto:
                await self._save_checkpoint(conn, events[upto - 1].checkpoint)
            PUBLISHED.labels(relay=self.name).inc(acked)
        if acked < len(events):
            raise RelayPublishError(
                f"{len(events) - acked} of {len(events)} events unacknowledged "
                f"from position {order[acked].position}"
            )
        return acked

    async def _publish(self, events: Sequence[OutboxEvent]) -> int:
        """Publish pipelined; return the length of the acknowledged prefix."""
        futures: list[asyncio.Future[PubAck]] = []
        try:
            for event in events:
                futures.append(
                    await self.js.publish_async(
                        subject_of(event),
                        envelope_of(event),
                        wait_stall=self.publish_timeout,
                        stream=self.expected_stream,
                        headers=headers_of(event),
                    )
                )
        except Exception as exc:  # stalled or closed: wait for what went out, then stop
            log.warning("relay_publish_failed", relay=self.name, error=repr(exc))
        # The timeout is the only bound: nats-py 2.16 never resolves the future of a publish
        # that the server refused (its reply handler raises instead of setting the error).
        results: Sequence[PubAck | BaseException | None]
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*futures, return_exceptions=True), self.publish_timeout
            )
        except TimeoutError:
            log.warning("relay_ack_timeout", relay=self.name, pending=len(futures))
            # Acks that did arrive still count; cancelled ones end the prefix.
            results = [_outcome(f) for f in futures]
        for i, result in enumerate(results):
            if not isinstance(result, PubAck):
                log.warning("relay_unacked", relay=self.name, position=events[i].position)
                return i
        return len(results)

    async def _after_publish(self, events: Sequence[OutboxEvent]) -> None:
        """Runs between the acks and the checkpoint write; tests inject crashes here."""

    # --- checkpoint and lag ---------------------------------------------------------------

    async def _load_checkpoint(self, conn: psycopg.AsyncConnection[Any]) -> Checkpoint:
        cur = await conn.execute(
            "SELECT tx_id::text, position FROM relay_checkpoints WHERE name = %s", (self.name,)
        )
        row = await cur.fetchone()
        cp = Checkpoint(int(row[0]), int(row[1])) if row else Checkpoint(0, 0)
        log.info("relay_resume", relay=self.name, tx_id=cp.tx_id, position=cp.position)
        return cp

    async def _save_checkpoint(self, conn: psycopg.AsyncConnection[Any], cp: Checkpoint) -> None:
        await conn.execute(
            _SAVE_CHECKPOINT, {"name": self.name, "tx": str(cp.tx_id), "pos": cp.position}
        )
        self._checkpoint = cp

    async def _update_lag(self, conn: psycopg.AsyncConnection[Any]) -> None:
        cur = await conn.execute("SELECT coalesce(max(position), 0) FROM events")
        row = await cur.fetchone()
        head = int(row[0]) if row else 0
        done = self._checkpoint.position if self._checkpoint else 0
        LAG.labels(relay=self.name).set(max(0, head - done))

    # --- the loop ----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Relay until `stop` is set; failures are logged, backed off and retried."""
        backoff = self.poll_interval
        try:
            while not stop.is_set():
                try:
                    if not await self._hold_lock():
                        await _sleep_unless(stop, max(self.poll_interval, 1.0))
                        continue
                    await self._listening()
                    await self.run_once()
                    backoff = self.poll_interval
                    await self._wait_for_wakeup(stop)
                except Exception as exc:
                    FAILURES.labels(relay=self.name).inc()
                    log.warning("relay_round_failed", relay=self.name, error=repr(exc))
                    await self._drop_broken()
                    await _sleep_unless(stop, backoff)
                    backoff = min(backoff * 2, self.max_backoff)
        finally:
            await self.close()

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(self.database_url, autocommit=True)
            # A new session: the checkpoint may have moved (another instance) and locks are gone.
            self._checkpoint = None
            self._locked = False
        return self._conn

    async def _listening(self) -> psycopg.AsyncConnection[Any]:
        if self._listen is None or self._listen.closed:
            self._listen = await psycopg.AsyncConnection.connect(self.database_url, autocommit=True)
            await self._listen.execute(f"LISTEN {_NOTIFY_CHANNEL}")
        return self._listen

    async def _hold_lock(self) -> bool:
        if not self.single_active or self._locked:
            return True
        conn = await self._connection()
        cur = await conn.execute(
            "SELECT pg_try_advisory_lock(hashtext('hf_relay:' || %s))", (self.name,)
        )
        row = await cur.fetchone()
        self._locked = bool(row and row[0])
        if not self._locked:
            log.info("relay_standby", relay=self.name)
        return self._locked

    async def _wait_for_wakeup(self, stop: asyncio.Event) -> None:
        """Return on a NOTIFY, on `stop`, or after `poll_interval` (late commits and aborts
        send no NOTIFY)."""
        if stop.is_set():
            return
        listen = await self._listening()
        notified = asyncio.create_task(self._next_notify(listen))
        stopped = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({notified, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (notified, stopped):
                task.cancel()
            await asyncio.gather(notified, stopped, return_exceptions=True)
        if notified.done() and not notified.cancelled() and notified.exception():
            raise notified.exception()  # type: ignore[misc]

    async def _next_notify(self, listen: psycopg.AsyncConnection[Any]) -> None:
        async with contextlib.aclosing(
            listen.notifies(timeout=self.poll_interval, stop_after=1)
        ) as gen:
            async for _ in gen:
                pass
        # Many commits send many NOTIFYs; one round covers them all, so drop the backlog.
        async with contextlib.aclosing(listen.notifies(timeout=0)) as gen:
            async for _ in gen:
                pass

    async def _drop_broken(self) -> None:
        for attr in ("_conn", "_listen"):
            conn: psycopg.AsyncConnection[Any] | None = getattr(self, attr)
            if conn is not None and (conn.closed or conn.broken):
                with contextlib.suppress(Exception):
                    await conn.close()
                setattr(self, attr, None)


def _outcome(future: asyncio.Future[PubAck]) -> PubAck | None:
    if future.done() and not future.cancelled() and future.exception() is None:
        return future.result()
    return None


async def _sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
