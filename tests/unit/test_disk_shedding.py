"""Free space under HETEROFLOW_HOME (libs/diskspace.py): the threshold is the smaller of the
two settings, a reading below it names the free space, the gateway's shedding answers writes
503 + Retry-After while it is low and lets reads through; readiness reports name their cause
(libs/health.py). The full disk itself is tests/integration/test_disk_full.py."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from libs.diskspace import MB, DiskSpace, Reading, threshold_bytes
from libs.health import Readiness
from services.api_gateway.shedding import Shedding

GB = 1024 * MB


@pytest.mark.parametrize(
    ("total", "mb", "percent", "expected"),
    [
        (200 * MB, 500, 5, 10 * MB),  # a small volume: 5 %
        (1024 * GB, 500, 5, 500 * MB),  # a large one: 500 MB
        (10 * GB, 500, 5, 500 * MB),  # where the two meet
        (1024 * GB, 0, 5, 0),  # off
        (1024 * GB, 500, 0, 0),  # off
    ],
)
def test_threshold_is_the_smaller_of_the_two(
    total: int, mb: float, percent: float, expected: int
) -> None:
    assert threshold_bytes(total, mb, percent) == expected


def test_a_low_reading_names_the_free_space_and_the_threshold() -> None:
    assert Reading(11 * MB, 200 * MB, 10 * MB).cause() is None
    cause = Reading(3 * MB, 200 * MB, 10 * MB).cause()
    assert cause == "3.0 MB free under HETEROFLOW_HOME, below the threshold of 10.0 MB"


def test_a_real_directory_is_read_and_cached(tmp_path: Path) -> None:
    now = [0.0]
    disk = DiskSpace(tmp_path / "not-made-yet", clock=lambda: now[0])
    first = disk.read()
    assert first.total_bytes > 0 and 0 <= first.free_bytes <= first.total_bytes
    assert disk.read() is first  # within the cache interval
    now[0] = 1.0
    assert disk.read() is not first
    assert DiskSpace(tmp_path, 10**9, 100).cause() is not None  # never all free
    assert DiskSpace(tmp_path, min_free_mb=0).cause() is None


class LowDisk(DiskSpace):
    def __init__(self) -> None:
        super().__init__(Path("/"))
        self.low: str | None = "3.0 MB free under HETEROFLOW_HOME, below the threshold of 10.0 MB"

    def cause(self) -> str | None:
        return self.low


async def test_writes_are_shed_while_the_disk_is_low_and_reads_are_not() -> None:
    async def ok(_: Request) -> PlainTextResponse:
        return PlainTextResponse("done")

    inner = Starlette(
        routes=[Route("/api/v1/tasks", ok, methods=["GET", "POST"]), Route("/readyz", ok)]
    )
    disk = LowDisk()
    app = Shedding(inner, max_reads=0, max_writes=0, db_wait_s=2.0, disk=disk)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        r = await client.post("/api/v1/tasks", json={})
        assert r.status_code == 503
        assert r.headers["retry-after"] == "5"
        assert r.json()["code"] == 50302
        assert r.json()["error"].startswith("3.0 MB free under HETEROFLOW_HOME")
        assert (await client.get("/api/v1/tasks")).status_code == 200
        assert (await client.get("/readyz")).status_code == 200
        disk.low = None
        assert (await client.post("/api/v1/tasks", json={})).status_code == 200


def test_reports_name_their_cause_and_withdraw() -> None:
    r = Readiness()
    cause: list[str | None] = ["insufficient resources"]
    r.report("jetstream_writes", lambda: cause[0])
    r.report("broken", lambda: str(1 / 0))
    assert r.reports() == {
        "broken": "ZeroDivisionError: division by zero",
        "jetstream_writes": "insufficient resources",
    }
    assert r.unmet() == [
        "broken: ZeroDivisionError: division by zero",
        "jetstream_writes: insufficient resources",
    ]
    cause[0] = None
    r.withdraw("broken")
    assert r.reports() == {"jetstream_writes": "ok"}
    assert r.unmet() == []
