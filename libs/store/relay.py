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

Order across a failover: a batch is pipelined, and each message carries
``Nats-Expected-Last-Sequence`` (the stream's last sequence before it, known from the previous
ack). When the server the relay is connected to dies, the messages it held are lost while the
client sends the rest to the next server after reconnecting; unchained, those would be stored
ahead of the lost ones and the retry would put the lost ones behind them. Chained, JetStream
refuses them (wrong last sequence), the relay publishes the first unacknowledged event alone
(its ack tells the last sequence again) and goes on pipelined. `Nats-Expected-Last-Msg-Id`
would chain as well on one server, but a clustered stream checks it when it applies the
entry and stops accepting writes on a mismatch ("critical write error").

No poison pills: an event JetStream refuses for good (larger than the server's payload limit,
or than the stream's message size) is recorded in `relay_dead_letters`
(libs/store/dead_letters.py), counted and logged, and the checkpoint moves past it; a refusal
that would hit every event (a stream missing or misnamed, a server down) is not permanent and
holds the relay, which retries. `heteroflow_relay_lag_events` counts the committed events past
the checkpoint, after every round, failed ones included.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import psycopg
import structlog
from nats.js import JetStreamContext
from nats.js.api import PubAck
from prometheus_client import Counter, Gauge
from psycopg.rows import kwargs_row

from libs.bus import subjects as s
from libs.bus.acks import AckInbox
from libs.bus.broker import Routes
from libs.domain.envelope import EventEnvelope

from .dead_letters import DeadLetter, record
from .outbox import (
    Checkpoint,
    OutboxEvent,
    envelope_of,
    headers_of,
    in_stream_order,
    is_permanent,
    message_size,
    outbox_row,
    subject_of,
)

# Re-exported: callers and tests import the message helpers from here.
__all__ = [
    "Checkpoint",
    "OutboxEvent",
    "OutboxRelay",
    "RelayPublishError",
    "envelope_of",
    "headers_of",
    "in_stream_order",
    "message_size",
    "routes",
    "subject_of",
]

log = structlog.get_logger(__name__)

PUBLISHED = Counter(
    "heteroflow_relay_published_events", "Events acknowledged by JetStream", ["relay"]
)
FAILURES = Counter(
    "heteroflow_relay_failures", "Relay rounds that failed and backed off", ["relay"]
)
LAG = Gauge(
    "heteroflow_relay_lag_events",
    "Committed events past the relay checkpoint (not yet published or dead-lettered)",
    ["relay"],
)
DEAD_LETTERS = Counter(
    "heteroflow_relay_dead_letters",
    "Events JetStream refused for good, recorded in relay_dead_letters and skipped",
    ["relay"],
)

_NOTIFY_CHANNEL = "hf_events"
HDR_EXPECTED_STREAM = "Nats-Expected-Stream"
HDR_EXPECTED_LAST_SEQ = "Nats-Expected-Last-Sequence"

# ORDER BY names the table's column: a bare `tx_id` there would be the text output column
# of the same name (PostgreSQL prefers output names in ORDER BY), '1000' would sort before
# '999', and a batch cut across such a boundary would move the checkpoint past events it
# never read.
#
# The message body is written by PostgreSQL (json_build_object over the row, payload and
# metadata embedded as they are stored): the relay neither parses them nor encodes them again.
_SELECT = """
SELECT position, event_id, stream_id, stream_type, version, type, schema_version,
       occurred_at, tx_id::text AS tx_id,
       json_build_object(
         'event_id', event_id, 'position', position, 'stream_id', stream_id,
         'stream_type', stream_type, 'version', version, 'type', type,
         'schema_version', schema_version, 'occurred_at', occurred_at,
         'payload', payload, 'metadata', metadata
       )::text AS body
FROM events
WHERE (tx_id, position) > (%(tx)s::xid8, %(pos)s)
  AND tx_id < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY events.tx_id, events.position
LIMIT %(limit)s
"""

# What the lag gauge shows: committed events not yet published nor dead-lettered.
_LAG = """
SELECT count(*) FROM events WHERE (tx_id, position) > (%(tx)s::xid8, %(pos)s)
"""

# Monotonic: a stale relay instance finishing late cannot move the checkpoint backwards.
_SAVE_CHECKPOINT = """
INSERT INTO relay_checkpoints (name, tx_id, position, updated_at)
VALUES (%(name)s, %(tx)s::xid8, %(pos)s, now())
ON CONFLICT (name) DO UPDATE
SET tx_id = EXCLUDED.tx_id, position = EXCLUDED.position, updated_at = EXCLUDED.updated_at
WHERE (relay_checkpoints.tx_id, relay_checkpoints.position) < (EXCLUDED.tx_id, EXCLUDED.position)
"""


def routes() -> Routes:
    """What the relay publishes, declared for the AsyncAPI document.

    The relay itself stays on nats-py: it needs pipelined publishes whose acks and refusals
    it awaits as a prefix (`libs/bus/acks.py`), chained on the stream's last sequence, to
    move its checkpoint only past acknowledged events, which FastStream's publisher does not
    offer.
    """
    r = Routes("outbox-relay")
    r.publishes(
        EventEnvelope,
        subject=f"{s.EVENTS_PREFIX}.{{stream_type}}.{{stream_id}}.{{event_type}}",
        description=f"Committed domain events, Nats-Msg-Id = event id (stream {s.EVENTS_STREAM}).",
    )
    return r


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
        max_message_bytes: int | None = None,
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
        # None: the connected server's max_payload (read on each round: it can change).
        self.max_message_bytes = max_message_bytes
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._listen: psycopg.AsyncConnection[Any] | None = None
        self._checkpoint: Checkpoint | None = None
        self._locked = False
        self._acks: AckInbox | None = None
        # The stream's last sequence as this relay's last ack told it; None: not known.
        self._last_seq: int | None = None
        # Why the last round failed, None after one that succeeded: the relay process's
        # readiness names it (services/relay/service.py).
        self.failure: str | None = None

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
        if self._acks is not None:
            await self._acks.close()
        self._acks = None
        self._last_seq = None

    # --- one round ----------------------------------------------------------------------

    async def run_once(self) -> int:
        """Publish every event committed so far; return how many were acknowledged."""
        conn = await self._connection()
        if self._checkpoint is None:
            self._checkpoint = await self._load_checkpoint(conn)
        total = 0
        while True:
            handled, published, lag_counted = await self._relay_batch(conn)
            total += published
            if handled < self.batch_size:
                break
        if not lag_counted:
            await self._update_lag(conn)
        return total

    async def _relay_batch(self, conn: psycopg.AsyncConnection[Any]) -> tuple[int, int, bool]:
        """One batch: (events handled, i.e. published or dead-lettered; events published;
        whether the lag gauge was counted with the checkpoint's write). The last batch of a
        round (short, all handled) writes its checkpoint and counts the lag in one round
        trip."""
        assert self._checkpoint is not None
        cp = self._checkpoint
        async with conn.cursor(row_factory=kwargs_row(outbox_row)) as cur:
            await cur.execute(
                _SELECT, {"tx": str(cp.tx_id), "pos": cp.position, "limit": self.batch_size}
            )
            events = await cur.fetchall()
        if not events:
            return 0, 0, False
        order = in_stream_order(events)
        handled, published = await self._deliver(conn, order)
        last = handled == len(events) < self.batch_size
        lag_counted = False
        if handled:
            done = {e.event_id for e in order[:handled]}
            # The checkpoint covers the longest run, in (tx_id, position) order, of handled
            # events.
            upto = next((i for i, e in enumerate(events) if e.event_id not in done), len(events))
            await self._after_publish(published)
            if upto:
                cp = events[upto - 1].checkpoint
                lag_counted = last
                await self._save_checkpoint(conn, cp, count_lag=last)
            PUBLISHED.labels(relay=self.name).inc(len(published))
        if handled < len(events):
            raise RelayPublishError(
                f"{len(events) - handled} of {len(events)} events unacknowledged "
                f"from position {order[handled].position}"
            )
        return handled, len(published), lag_counted

    async def _deliver(
        self, conn: psycopg.AsyncConnection[Any], events: Sequence[OutboxEvent]
    ) -> tuple[int, list[OutboxEvent]]:
        """Publish `events` in order, dead-lettering those refused for good; return how long a
        prefix is handled and which of its events JetStream acknowledged."""
        limit = self._max_message_bytes()
        bodies = [envelope_of(e) for e in events]
        sizes = [
            message_size(e, self.expected_stream, b) for e, b in zip(events, bodies, strict=True)
        ]
        published: list[OutboxEvent] = []
        i = 0
        while i < len(events):
            # Pipeline up to the next event the server would refuse by size (it would close
            # the connection rather than answer), then learn why the stop happened.
            # Pipelined only from a known last sequence; else one alone first, to learn it.
            end = next((k for k in range(i, len(events)) if sizes[k] > limit), len(events))
            if self._last_seq is not None:
                acked = await self._publish(events[i:end], bodies[i:end])
                published.extend(events[i : i + acked])
                i += acked
                if i == len(events):
                    break
            if i < end:
                refusal = await self._publish_alone(events[i])
                if refusal is None:
                    published.append(events[i])
                    i += 1
                    continue
                if not is_permanent(refusal):
                    break
                error = f"{type(refusal).__name__}: {refusal}"
            else:
                error = f"message of {sizes[i]} bytes exceeds the server's max_payload {limit}"
            await self._dead_letter(conn, events[i], sizes[i], error)
            i += 1
        return i, published

    async def _publish_alone(self, event: OutboxEvent) -> BaseException | None:
        """Publish one event, unchained, and wait for its answer: None when acknowledged,
        else the error. Its ack tells the stream's last sequence, from which the next
        pipelined publishes chain (not a duplicate's: that is an older message's)."""
        self._last_seq = None
        try:
            ack = await self.js.publish(
                subject_of(event),
                envelope_of(event),
                timeout=self.publish_timeout,
                headers=self._headers(event),
            )
        except Exception as exc:  # noqa: BLE001 - classified by the caller
            return exc
        if not ack.duplicate:
            self._last_seq = ack.seq
        return None

    async def _dead_letter(
        self, conn: psycopg.AsyncConnection[Any], event: OutboxEvent, size: int, error: str
    ) -> None:
        letter = DeadLetter(
            relay=self.name,
            event_id=event.event_id,
            position=event.position,
            stream_id=event.stream_id,
            stream_type=event.stream_type,
            type=event.type,
            subject=subject_of(event),
            size_bytes=size,
            error=error[:2000],
        )
        await record(conn, letter)
        DEAD_LETTERS.labels(relay=self.name).inc()
        log.error(
            "relay_dead_letter",
            relay=self.name,
            event_id=str(event.event_id),
            position=event.position,
            stream_id=event.stream_id,
            type=event.type,
            size_bytes=size,
            error=error,
        )

    def _max_message_bytes(self) -> int:
        if self.max_message_bytes is not None:
            return self.max_message_bytes
        # nats-py exposes the server's INFO max_payload only on the client.
        return int(self.js._nc.max_payload)

    async def _publish(self, events: Sequence[OutboxEvent], bodies: Sequence[bytes]) -> int:
        """Publish pipelined, chained on the stream's last sequence; return the length of the
        acknowledged prefix.

        Message k carries `Nats-Expected-Last-Sequence` = the last sequence before the batch
        + k: one lost on the way (the server it went to killed; the client sends the rest to
        the next server after it reconnects) makes every later one refused rather than
        stored ahead of it, so a retry cannot put an event behind a later one."""
        assert self._last_seq is not None
        if self._acks is None:
            self._acks = AckInbox(self.js._nc)
        base = self._last_seq
        futures: list[asyncio.Future[PubAck]] = []
        try:
            for k, (event, body) in enumerate(zip(events, bodies, strict=True)):
                futures.append(
                    await self._acks.publish(
                        subject_of(event), body, self._headers(event, last_seq=base + k)
                    )
                )
        except Exception as exc:  # closed or its buffer full: wait for what went out
            log.warning("relay_publish_failed", relay=self.name, error=repr(exc))
        results: Sequence[PubAck | BaseException | None]
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*futures, return_exceptions=True), self.publish_timeout
            )
        except TimeoutError:
            log.warning("relay_ack_timeout", relay=self.name, pending=len(futures))
            # Acks that did arrive still count; the others end the prefix.
            results = [_outcome(f) for f in futures]
        acked = next((i for i, r in enumerate(results) if not isinstance(r, PubAck)), len(results))
        if acked < len(events):
            log.warning(
                "relay_unacked",
                relay=self.name,
                position=events[acked].position,
                error=repr(results[acked] or "no answer") if acked < len(results) else "not sent",
            )
        last = results[acked - 1] if acked else None
        # Known again only when every message was stored as the chain said; otherwise the
        # next publish goes alone and its ack tells.
        chained = acked == len(events) and isinstance(last, PubAck) and not last.duplicate
        self._last_seq = last.seq if chained and isinstance(last, PubAck) else None
        return acked

    def _headers(self, event: OutboxEvent, last_seq: int | None = None) -> dict[str, str]:
        headers = headers_of(event)
        if self.expected_stream is not None:
            headers[HDR_EXPECTED_STREAM] = self.expected_stream
        if last_seq is not None:
            headers[HDR_EXPECTED_LAST_SEQ] = str(last_seq)
        return headers

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

    async def _save_checkpoint(
        self, conn: psycopg.AsyncConnection[Any], cp: Checkpoint, *, count_lag: bool = False
    ) -> None:
        """Write the checkpoint; with `count_lag`, count the lag past it in the same round trip
        (two autocommitted statements, pipelined)."""
        params = {"name": self.name, "tx": str(cp.tx_id), "pos": cp.position}
        if not count_lag:
            await conn.execute(_SAVE_CHECKPOINT, params)
            self._checkpoint = cp
            return
        async with conn.pipeline():
            await conn.execute(_SAVE_CHECKPOINT, params)
            cur = await conn.execute(_LAG, params)
        self._checkpoint = cp
        row = await cur.fetchone()
        LAG.labels(relay=self.name).set(int(row[0]) if row else 0)

    async def _update_lag(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Count, not subtract: positions have gaps and the checkpoint is (tx_id, position)."""
        cp = self._checkpoint or await self._load_checkpoint(conn)
        cur = await conn.execute(_LAG, {"tx": str(cp.tx_id), "pos": cp.position})
        row = await cur.fetchone()
        LAG.labels(relay=self.name).set(int(row[0]) if row else 0)

    async def _update_lag_after_failure(self) -> None:
        """A failed round still tells how far behind it is (best effort: the database may be
        what failed)."""
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            return
        with contextlib.suppress(Exception):
            await self._update_lag(conn)

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
                    self.failure = None
                    backoff = self.poll_interval
                    await self._wait_for_wakeup(stop)
                except Exception as exc:
                    FAILURES.labels(relay=self.name).inc()
                    self.failure = f"{type(exc).__name__}: {exc}"[:500]
                    log.warning("relay_round_failed", relay=self.name, error=repr(exc))
                    await self._update_lag_after_failure()
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
