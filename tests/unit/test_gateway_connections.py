"""The pure parts of the gateway's slow-client defences: the connection cap derived from
the open-files limit, and the event loop handler that logs failed accepts once an interval.
(The deadlines and the cap at work: tests/integration/test_slow_clients_e2e.py.)"""

from __future__ import annotations

import asyncio
import resource
from typing import Any

import pytest

from services.api_gateway import connections
from services.api_gateway.connections import ACCEPT_FAILED, AcceptErrors, connection_cap


@pytest.mark.parametrize(
    ("soft", "cap"),
    [
        (1024, 1024 - 256 - connections.ACCEPTS_IN_FLIGHT),
        (65536, 65536 - 16384 - connections.ACCEPTS_IN_FLIGHT),
        (256, 16),  # too small to leave room: the floor
    ],
    ids=["1024", "65536", "tiny"],
)
def test_the_cap_leaves_room_below_the_open_files_limit(
    monkeypatch: pytest.MonkeyPatch, soft: int, cap: int
) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _: (soft, soft))
    assert connection_cap(0) == cap
    assert connection_cap(300) == 300  # a configured cap is taken as it is


def test_failed_accepts_are_logged_once_an_interval_the_rest_passed_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.new_event_loop()
    try:
        passed: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _, ctx: passed.append(ctx))
        logged: list[dict[str, Any]] = []
        monkeypatch.setattr(connections.log, "warning", lambda event, **kw: logged.append(kw))
        now = [100.0]
        handler = AcceptErrors(loop, every_s=10.0, clock=lambda: now[0])
        failed = {"message": ACCEPT_FAILED, "exception": OSError(24, "Too many open files")}
        for _ in range(2048):  # one wake-up of the listening socket
            handler(loop, failed)
        now[0] += 10.0
        handler(loop, failed)
        handler(loop, {"message": "something else"})
    finally:
        loop.close()
    assert [entry["since_last"] for entry in logged] == [0, 2047]
    assert passed == [{"message": "something else"}]
