"""The JetStream write probe (libs/bus/writes.py) on a real nats-server: a write is
acknowledged and keeps one message per prober; a stream gone (a lost store) fails the probe,
which declares it again and writes on the next one. The full disk is test_disk_full.py."""

from __future__ import annotations

import uuid

import pytest

from libs.bus.nats import connect
from libs.bus.writes import HEALTH_STREAM, PAYLOAD_BYTES, WRITES_OK, WriteProbe

pytestmark = pytest.mark.integration


async def test_the_probe_writes_and_declares_its_stream_again_once_it_is_gone(
    nats_url: str,
) -> None:
    nc = await connect(nats_url, "test-write-probe")
    name = f"probe-{uuid.uuid4().hex[:8]}"
    try:
        js = nc.jetstream()
        probe = WriteProbe(nc, name)
        assert probe.cause == "not probed yet"
        for _ in range(3):
            assert await probe.probe() is None
        assert probe.cause is None and not probe.refused
        assert WRITES_OK.labels(name)._value.get() == 1
        info = await js.stream_info(HEALTH_STREAM, subjects_filter=probe.subject)
        assert info.state.subjects == {probe.subject: 1}  # one kept, however many probes
        last = await js.get_last_msg(HEALTH_STREAM, probe.subject)
        assert len(last.data or b"") == PAYLOAD_BYTES

        await js.delete_stream(HEALTH_STREAM)
        cause = await probe.probe()
        assert cause is not None and probe.refused, cause  # connected, and not stored
        assert WRITES_OK.labels(name)._value.get() == 0
        assert await probe.probe() is None  # the stream declared again
    finally:
        await nc.close()
