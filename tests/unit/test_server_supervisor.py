"""The embedded-server supervisor's rules (libs/server_supervisor.py) on a stand-in server:
a server that dies is started again after the backoff, the backoff doubles while starts fail,
each restart is counted, and stop ends the watch without a restart. The real servers are
killed and brought back in tests/integration/test_embedded_servers.py."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from libs.server_supervisor import RESTARTS, UNHEALTHY, HealthCheck, ServerSupervisor
from tests.wait import wait_until_async


@dataclass
class FakeServer:
    """Dies when told; each restart either fails (the first `failing` ones) or runs again."""

    failing: int = 0
    code: int | None = None
    restarts_at: list[float] = field(default_factory=list)
    looked: int = 0  # how often the supervisor asked whether it runs

    @property
    def pid(self) -> int | None:
        return 4242

    def exit_code(self) -> int | None:
        self.looked += 1
        return self.code

    def restart(self) -> None:
        self.restarts_at.append(time.monotonic())
        if len(self.restarts_at) <= self.failing:
            raise RuntimeError("shared memory still in use")
        self.code = None


def restarts(name: str) -> float:
    return float(RESTARTS.labels(name)._value.get())


async def test_a_dead_server_is_started_again_after_the_backoff() -> None:
    server = FakeServer()
    sup = ServerSupervisor({"unit-a": server}, poll_s=0.01, first_backoff_s=0.2)
    stop = asyncio.Event()
    watch = asyncio.create_task(sup.run(stop))
    before = restarts("unit-a")
    await wait_until_async(lambda: server.looked >= 5, 5.0, 0.01)  # watched a few rounds
    assert server.restarts_at == []  # running: nothing to do
    died = time.monotonic()
    server.code = -9
    await wait_until_async(lambda: server.code is None, 5.0, 0.01)
    assert server.restarts_at[0] - died >= 0.2
    assert restarts("unit-a") == before + 1
    stop.set()
    await asyncio.wait_for(watch, 2)


async def test_failed_starts_are_retried_with_a_doubling_backoff() -> None:
    server = FakeServer(failing=2, code=1)
    sup = ServerSupervisor({"unit-b": server}, poll_s=0.01, first_backoff_s=0.1)
    stop = asyncio.Event()
    before = restarts("unit-b")
    watch = asyncio.create_task(sup.run(stop))
    await wait_until_async(lambda: server.code is None, 5.0, 0.01)
    first, second, third = server.restarts_at
    assert second - first >= 0.2 and third - second >= 0.4  # 0.1, then 0.2, then 0.4
    assert restarts("unit-b") == before + 1  # only the start that worked counts
    stop.set()
    await asyncio.wait_for(watch, 2)


async def test_stop_during_the_backoff_restarts_nothing() -> None:
    server = FakeServer(code=-9)
    sup = ServerSupervisor({"unit-c": server}, poll_s=0.01, first_backoff_s=5)
    stop = asyncio.Event()
    watch = asyncio.create_task(sup.run(stop))
    await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(watch, 1)
    assert server.restarts_at == []


@dataclass
class BrokenServer(FakeServer):
    """Alive but broken until it is ended and started again."""

    ended: int = 0
    broken: bool = True

    def end(self) -> None:
        self.ended += 1
        self.code = 0

    def restart(self) -> None:
        super().restart()
        self.broken = False


async def test_a_server_its_health_check_finds_broken_is_ended_and_started_again() -> None:
    server = BrokenServer()
    cause = "JetStream refused a write"
    check = HealthCheck(lambda: cause if server.broken else None, server.end)
    sup = ServerSupervisor(
        {"unit-h": server},
        poll_s=0.01,
        first_backoff_s=0.05,
        health={"unit-h": check},
        unhealthy_after_s=0.2,
        health_grace_s=0.1,
    )
    stop = asyncio.Event()
    before = float(UNHEALTHY.labels("unit-h")._value.get())
    started = time.monotonic()
    watch = asyncio.create_task(sup.run(stop))
    await wait_until_async(lambda: server.restarts_at, 5.0, 0.01, "restarted")
    # Past the grace after its start, broken for the whole unhealthy window.
    assert server.restarts_at[0] - started >= 0.1 + 0.2 + 0.05
    assert server.ended == 1 and server.code is None
    assert float(UNHEALTHY.labels("unit-h")._value.get()) == before + 1
    await wait_until_async(lambda: server.looked >= 200, 5.0, 0.01)  # healthy: left alone
    assert server.ended == 1 and len(server.restarts_at) == 1
    stop.set()
    await asyncio.wait_for(watch, 2)


async def test_a_check_that_says_none_is_never_acted_on() -> None:
    server = BrokenServer()
    check = HealthCheck(lambda: None, server.end)  # e.g. the disk is still full
    sup = ServerSupervisor(
        {"unit-n": server},
        poll_s=0.01,
        health={"unit-n": check},
        unhealthy_after_s=0.05,
        health_grace_s=0.0,
    )
    stop = asyncio.Event()
    watch = asyncio.create_task(sup.run(stop))
    await wait_until_async(lambda: server.looked >= 50, 5.0, 0.01)
    assert server.ended == 0 and server.restarts_at == []
    stop.set()
    await asyncio.wait_for(watch, 2)


def test_up_watches_its_servers_on_the_configured_bounds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from heteroflow.platform import Platform, PlatformSettings

    def supervisor() -> ServerSupervisor:
        return Platform(PlatformSettings(home=tmp_path)).server_supervisor()

    assert supervisor().unhealthy_after_s == 5.0
    monkeypatch.setenv("HETEROFLOW_EMBEDDED_UNHEALTHY_AFTER_S", "120")
    monkeypatch.setenv("HETEROFLOW_EMBEDDED_RESTART_BACKOFF_S", "3")
    assert (supervisor().unhealthy_after_s, supervisor().first_backoff_s) == (120.0, 3.0)
