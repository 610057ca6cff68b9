"""Leader leases in a NATS KV bucket, for controllers of which exactly one may act at a time.

A lease is one key in the bucket ``hf_leases`` whose TTL is the lease duration: the bucket's
max_age removes a value that nobody rewrote within the TTL, so a crashed holder's lease frees
itself. Acquiring is ``create`` (succeeds only when the key is absent); renewing is ``update``
with the revision we last wrote, a compare-and-set that fails as soon as anyone else has
written the key, or the key expired. The revision written at acquisition is the fencing token:
it only grows from one holder to the next, so a store that remembers the highest token it has
seen can refuse a write from a holder that lost the lease without noticing.

The revisions are the bucket's stream sequence, and a bucket lost with its JetStream store
starts again at 1 while the store (PostgreSQL's `fences`) remembers the old, higher tokens:
every new leader would be refused until the revisions climbed past them (days, for an
installation that ran for weeks). So whoever declares the bucket gives `open_lease_bucket`
the newest token the store has seen (`floor`), and a bucket whose revisions are behind it is
moved past it (`raise_revisions`: a purge up to floor + 1, which JetStream answers by starting
the sequence there). Tokens stay the revisions, and stay monotonic across the loss.

Holder ids must be unique per process (e.g. ``<host>-<pid>-<uuid>``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import structlog
from nats.js import JetStreamContext
from nats.js.errors import (
    APIError,
    BadRequestError,
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
)
from nats.js.kv import KeyValue

from libs.cancellation import cancel_and_wait

from .nats import configured_replicas, when_jetstream_answers
from .subjects import LEASE_BUCKET

log = structlog.get_logger(__name__)

# JetStream's "wrong last sequence" codes: the compare-and-set lost.
_WRONG_LAST_SEQUENCE = (10071, 10164)
_STREAM_NAME_IN_USE = 10058


async def open_lease_bucket(
    js: JetStreamContext,
    ttl: float,
    bucket: str = LEASE_BUCKET,
    replicas: int | None = None,
    *,
    floor: int | None = None,
) -> KeyValue:
    """The lease bucket, created with `ttl` if absent (`replicas` None = the configured
    HETEROFLOW_NATS_REPLICAS), waiting while JetStream is not ready (`when_jetstream_answers`).

    The TTL belongs to the bucket, so every lease in one bucket lasts as long; when the bucket
    exists with another TTL it is used as it is, and that TTL is logged.

    `floor`, the newest fencing token the store has seen for any lease of the bucket (the
    declarer's, who may purge): the next revision is made greater (`raise_revisions`).
    """

    async def opened() -> KeyValue:
        try:
            # Bound first: a service user may not create streams (the bucket is one), and `up`
            # declares the bucket before the services start.
            kv = await js.key_value(bucket)
        except BucketNotFoundError:
            kv = await created()
        status = await kv.status()
        if status.ttl is not None and abs(status.ttl - ttl) > 1e-3:
            log.warning(
                "lease_bucket_ttl_differs", bucket=bucket, wanted_s=ttl, actual_s=status.ttl
            )
        if floor:
            await raise_revisions(js, bucket, floor)
        return kv

    async def created() -> KeyValue:
        try:
            return await js.create_key_value(
                bucket=bucket, ttl=ttl, history=1, replicas=replicas or configured_replicas()
            )
        except BadRequestError as exc:
            if exc.err_code != _STREAM_NAME_IN_USE:
                raise
        return await js.key_value(bucket)

    return await when_jetstream_answers(f"lease bucket {bucket}", opened)


async def raise_revisions(js: JetStreamContext, bucket: str, floor: int) -> bool:
    """Make the next revision of `bucket` greater than `floor`; True when it had to move.

    A bucket behind the floor was lost and made again: every lease in it was written at a
    revision no greater than the floor, so its holder's writes are refused by the store
    already, and purging it (up to floor + 1: JetStream then starts the sequence there) costs
    the holders one election, each won at a token above every fence.
    """
    stream = f"KV_{bucket}"
    last = (await js.stream_info(stream)).state.last_seq
    if last >= floor:
        return False
    try:
        await js.purge_stream(stream, seq=floor + 1)
    except Exception as exc:  # a user that may not purge (a service on `up`'s NATS)
        log.error(
            "lease_bucket_behind_fences",
            bucket=bucket,
            last_revision=last,
            floor=floor,
            error=repr(exc),
            why="its leaders are refused until the bucket is declared by a user that may purge",
        )
        return False
    log.warning("lease_bucket_raised", bucket=bucket, last_revision=last, next_revision=floor + 1)
    return True


class LeaseLike(Protocol):
    """What `run_while_leader` needs of a lease (the NATS one below, or a test's)."""

    name: str

    @property
    def fencing_token(self) -> int | None: ...

    @property
    def held(self) -> bool: ...

    async def acquire(self) -> bool: ...

    async def renew(self) -> bool: ...

    async def release(self) -> None: ...


class Lease:
    """One named lease, held or contended by `holder_id`."""

    def __init__(self, kv: KeyValue, name: str, holder_id: str, ttl: float) -> None:
        self.kv = kv
        self.name = name
        self.holder_id = holder_id
        self.ttl = ttl
        self._revision: int | None = None
        self._token: int | None = None
        self._valid_until = 0.0

    @property
    def revision(self) -> int | None:
        """The revision we last wrote: the expected value of the next compare-and-set."""
        return self._revision

    @property
    def fencing_token(self) -> int | None:
        """The revision written when this holder acquired the lease; None when not held."""
        return self._token

    @property
    def held(self) -> bool:
        """True while we hold the lease and its TTL, counted from our last write, runs."""
        return self._revision is not None and time.monotonic() < self._valid_until

    async def acquire(self) -> bool:
        """Take the lease if nobody holds it; renew it if we already do."""
        if self._revision is not None:
            return await self.renew()
        # Counted from before the request: the server's TTL starts later, never earlier.
        started = time.monotonic()
        try:
            revision = await self.kv.create(self.name, self.holder_id.encode())
        except KeyWrongLastSequenceError:
            return False
        except KeyNotFoundError:
            # The holder's entry aged out between the refused create and the look nats-py
            # takes at it: nobody holds the lease now, and the next attempt takes it.
            return False
        self._revision = self._token = revision
        self._valid_until = started + self.ttl
        log.info("lease_acquired", lease=self.name, holder=self.holder_id, token=revision)
        return True

    async def renew(self) -> bool:
        """Extend the lease; False (and the lease dropped) when someone else has it now."""
        if self._revision is None:
            return False
        started = time.monotonic()
        try:
            revision = await self.kv.update(self.name, self.holder_id.encode(), last=self._revision)
        except KeyWrongLastSequenceError:
            log.warning("lease_lost", lease=self.name, holder=self.holder_id, token=self._token)
            self._forget()
            return False
        self._revision = revision
        self._valid_until = started + self.ttl
        return True

    async def release(self) -> None:
        """Give the lease up now, if we still hold it, so a standby need not wait for the TTL."""
        if self._revision is None:
            return
        try:
            await self.kv.delete(self.name, last=self._revision)
        except APIError as exc:
            if exc.err_code not in _WRONG_LAST_SEQUENCE:
                raise
        finally:
            log.info("lease_released", lease=self.name, holder=self.holder_id)
            self._forget()

    async def holder(self) -> str | None:
        """Who holds the lease now, per the bucket (None when free)."""
        try:
            entry = await self.kv.get(self.name)
        except Exception:  # KeyNotFoundError (absent or deleted)
            return None
        return entry.value.decode() if entry.value else None

    def _forget(self) -> None:
        self._revision = self._token = None
        self._valid_until = 0.0


async def run_while_leader(
    lease: LeaseLike,
    body: Callable[[int], Coroutine[Any, Any, None]],
    stop: asyncio.Event,
    *,
    renew_every: float,
    retry_every: float | None = None,
) -> None:
    """Run `body(fencing_token)` whenever we hold `lease`, until `stop` is set.

    `body` is cancelled when the lease is lost (a standby may already act), and started again
    with a new token once the lease is won back. When `body` returns or raises, the lease is
    released and this returns or re-raises. `renew_every` should be well under the TTL
    (a third is usual).
    """
    retry = retry_every if retry_every is not None else renew_every
    standing_by = False
    while not stop.is_set():
        try:
            won = await lease.acquire()
        except Exception:
            log.exception("lease_acquire_failed", lease=lease.name)
            won = False
        if not won:
            if not standing_by:  # once per term of someone else's: this replica waits
                log.info("lease_standby", lease=lease.name, retry_every_s=retry)
                standing_by = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), retry)
            continue
        assert lease.fencing_token is not None
        standing_by = False
        task = asyncio.create_task(body(lease.fencing_token))
        try:
            await _keep_renewed(lease, task, stop, renew_every)
        finally:
            await cancel_and_wait(task)
            # A no-op when the lease was lost; otherwise lets a standby in without the TTL.
            await _release_quietly(lease)
        if not task.cancelled():
            task.result()  # re-raise the body's error, if any
            return


async def _keep_renewed(
    lease: LeaseLike, task: asyncio.Task[None], stop: asyncio.Event, every: float
) -> None:
    """Renew until the lease is lost, `stop` is set, or `task` ends."""
    stopper = asyncio.create_task(stop.wait())
    try:
        while True:
            await asyncio.wait({task, stopper}, timeout=every, return_when=asyncio.FIRST_COMPLETED)
            if task.done() or stop.is_set():
                return
            try:
                if not await lease.renew():
                    return
            except Exception:
                # A transient bus error: keep acting only while our TTL surely runs.
                log.exception("lease_renew_failed", lease=lease.name)
                if not lease.held:
                    return
    finally:
        stopper.cancel()


async def _release_quietly(lease: LeaseLike) -> None:
    try:
        await lease.release()
    except Exception:
        log.exception("lease_release_failed", lease=lease.name)
