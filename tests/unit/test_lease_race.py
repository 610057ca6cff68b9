"""A lease contender meeting the holder's entry as it ages out (libs/bus/lease.py).

nats-py's `create` answers a refused create by reading the key; when the holder's entry
expires in between, that read raises KeyNotFoundError. Seen in a CI run of
tests/integration/test_bus.py (a standby polling as the TTL ran out); the real server cannot
be made to hit that instant on demand, so a stand-in KV plays it (pure client logic)."""

from __future__ import annotations

from typing import Any

from nats.js.errors import KeyNotFoundError

from libs.bus.lease import Lease


class ExpiringKv:
    """The first create meets the instant of expiry; the next one succeeds."""

    def __init__(self) -> None:
        self.creates = 0

    async def create(self, key: str, value: bytes) -> int:
        self.creates += 1
        if self.creates == 1:
            raise KeyNotFoundError
        return 7


async def test_a_lease_expiring_under_a_contender_is_taken_on_its_next_attempt() -> None:
    kv: Any = ExpiringKv()
    lease = Lease(kv, "ctl", "b", ttl=3.0)
    assert not await lease.acquire()  # not an exception out of the contender's loop
    assert not lease.held
    assert await lease.acquire()
    assert lease.held and lease.fencing_token == 7
