"""Does JetStream take writes? A probe that writes, for readiness and for `up`'s supervisor.

A connection that is up says nothing about writes: a JetStream stream whose store met a write
error (a full disk) keeps refusing every write after the space is back, without an error
answer (the publish times out), until nats-server restarts, while connections, stream info
and account info all answer. So the probe publishes: one message on the stream `HF_HEALTH`
(file storage, one message kept per subject, so it stays a few KiB) and waits for the ack.

The message is `PAYLOAD_BYTES` long, more than a page: each probe makes the store allocate,
so a full disk fails the probe (and breaks the health stream, which is then the canary of the
platform's streams: a store full long enough to fail their writes failed a probe's too, as the
probe writes every second). A probe that fails says why: JetStream's error, or that no ack
came within the timeout.
"""

from __future__ import annotations

import asyncio

import nats
import structlog
from nats.aio.client import Client
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import APIError, NotFoundError
from prometheus_client import Gauge

from . import subjects as s

log = structlog.get_logger(__name__)

HEALTH_STREAM = "HF_HEALTH"
HEALTH_PREFIX = f"{s.ROOT}.health"
PAYLOAD_BYTES = 8192
TIMEOUT_S = 2.0

WRITES_OK = Gauge(
    "heteroflow_jetstream_writes_ok",
    "1 when the last JetStream write probe was acknowledged, 0 when it failed",
    ["probe"],
)


def health_stream(replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        name=HEALTH_STREAM,
        description="write probes: one message kept per prober",
        subjects=[f"{HEALTH_PREFIX}.>"],
        storage=StorageType.FILE,
        retention=RetentionPolicy.LIMITS,
        discard=DiscardPolicy.OLD,
        max_msgs_per_subject=1,
        max_bytes=4 * 1024 * 1024,
        num_replicas=replicas,
    )


class WriteProbe:
    """Publishes one message per `probe()`; `cause` is why the last one failed (None: ok),
    `refused` whether it failed while connected (the server took the write and did not
    store it, as opposed to a connection that is down)."""

    def __init__(
        self,
        nc: Client,
        name: str,
        *,
        replicas: int = 1,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.name = name
        self.subject = f"{HEALTH_PREFIX}.{s.escape_token(name)}"
        self.replicas = replicas
        self.timeout_s = timeout_s
        self.cause: str | None = "not probed yet"
        self.refused = False
        self._declared = False
        self._payload = b"\0" * PAYLOAD_BYTES

    async def probe(self) -> str | None:
        """One write; returns (and keeps in `cause`) why it failed, None when acknowledged."""
        connected = self.nc.is_connected
        cause = await self._write() if connected else "not connected to NATS"
        if cause != self.cause:
            if cause is None:
                log.info("jetstream_writes_ok", probe=self.name)
            else:
                log.error("jetstream_writes_failed", probe=self.name, cause=cause)
        self.cause = cause
        self.refused = cause is not None and connected and self.nc.is_connected
        WRITES_OK.labels(self.name).set(0 if cause else 1)
        return cause

    async def _write(self) -> str | None:
        cause = await self._publish()
        if cause is not None:
            self._declared = False  # declared again next time: the stream may have gone
        return cause

    async def _publish(self) -> str | None:
        try:
            if not self._declared:
                await asyncio.wait_for(self._declare(), self.timeout_s)
            await self.js.publish(
                self.subject, self._payload, timeout=self.timeout_s, stream=HEALTH_STREAM
            )
        except NotFoundError:
            return f"stream {HEALTH_STREAM} not found"
        except APIError as exc:
            return f"JetStream refused a write: {exc.description or exc} (code {exc.err_code})"
        except (TimeoutError, nats.errors.TimeoutError):
            return (
                f"a write to stream {HEALTH_STREAM} got no acknowledgement within "
                f"{self.timeout_s:g} s"
            )
        except nats.errors.NoRespondersError:
            return "no JetStream server answered the write (JetStream disabled or unavailable)"
        except Exception as exc:  # noqa: BLE001 - any failure is the probe's answer
            return f"{type(exc).__name__}: {exc}"[:300]
        return None

    async def _declare(self) -> None:
        config = health_stream(self.replicas)
        try:
            await self.js.stream_info(HEALTH_STREAM)
        except NotFoundError:
            await self.js.add_stream(config)
        self._declared = True
