"""A full disk under `heteroflow up`, and the platform healing by itself once space is back.

`HETEROFLOW_HOME` on a 200 MB tmpfs of its own (mounted here: the test runs as root, and is
skipped with the reason when it cannot mount), `up` as a subprocess on it with the default
threshold (the smaller of 500 MB and 5 %: 10 MB here). A filler file takes every free byte:

* creates answer 503 with `Retry-After`, naming the free space (shed before the store);
* `/readyz` answers 503 naming `disk_space` and `jetstream_writes` (the write probe's store
  met the full disk);

while the disk is full the relay publishes events committed before (held back until then by
an open transaction, which keeps them past the relay's snapshot line: committed events not
yet published when the disk fills, deterministically), each larger than a page, so the events
stream's store meets the full disk too: `/readyz` names `relay`. The filler is removed and,
with nobody's help:

* the supervisor restarts nats-server (whose stores refused every write until then), the
  pending tasks run, each once, and creates are acknowledged again;
* `/readyz` answers 200, every check "ok", and the relay's lag is 0.

It prints how long healing took (space freed → every task ended, ready, relay caught up).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from libs import pidfile
from tests.integration.test_chaos import Up, _free_port, _reap, wait_completed
from tests.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TMPFS_SIZE = "200m"
CHUNK = 1024 * 1024
FULL_SEEN_WITHIN_S = 30.0
HEALED_WITHIN_S = 120.0
HELD_TASKS = 5
BIG_ENV = {"PADDING": "p" * 6000}  # a TaskCreated event larger than a page
LAG = re.compile(r'^heteroflow_relay_lag_events\{relay="outbox"\} (\S+)$', re.M)


def _mount_tmpfs(where: Path) -> str | None:
    """Mount a tmpfs of TMPFS_SIZE on `where`; the reason it could not, else None."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    where.mkdir(parents=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0755", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    return None if done.returncode == 0 else f"mount -t tmpfs refused: {done.stderr.strip()}"


@pytest.fixture
def small_disk_up() -> Iterator[Up]:
    root = Path(tempfile.mkdtemp(prefix="hf-disk-"))
    u = Up(root, _free_port(), _free_port())
    u.extra_env = {
        "HETEROFLOW_EMBEDDED_RESTART_BACKOFF_S": "1",
        # The agent's own state (its attempt records, task logs) on the big disk: this test
        # is about the platform's stores.
        "HETEROFLOW_STATE_DIR": str(root / "agent-state"),
    }
    reason = _mount_tmpfs(u.home)
    if reason:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(reason)
    try:
        yield u
    finally:
        if u.proc is not None and u.proc.poll() is None:
            u.proc.kill()
            u.proc.wait()
        _reap(root)
        for pids in u.server_pids().values():
            for pid in pids:
                pidfile.terminate(pid, signal.SIGKILL, 5)
        subprocess.run(["umount", str(u.home)], check=False)
        if os.path.ismount(u.home):
            subprocess.run(["umount", "-l", str(u.home)], check=False)
        shutil.rmtree(root, ignore_errors=True)


def fill(path: Path) -> int:
    """Write `path` until the file system has no byte left; the bytes written."""
    written = 0
    with path.open("wb", buffering=0) as fh:
        for size in (CHUNK, 4096, 512):
            block = b"\xa5" * size
            with contextlib.suppress(OSError):
                while True:
                    written += fh.write(block)
    return written


def database_url(up: Up) -> str:
    """The embedded PostgreSQL's URL, from its postmaster.pid (the socket directory line)."""
    lines = (up.home / "postgres" / "postmaster.pid").read_text().splitlines()
    return f"postgresql://postgres:@/postgres?host={lines[4].strip()}"


def relay_lag(up: Up) -> float | None:
    try:
        text = httpx.get(f"{up.url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    found = LAG.search(text)
    return float(found.group(1)) if found else None


def test_a_full_disk_is_refused_early_and_the_platform_heals_once_space_is_back(
    small_disk_up: Up,
) -> None:
    up = small_disk_up
    up.start()
    filler = up.home / "filler"
    with up.client() as api, psycopg.connect(database_url(up)) as hold:
        hold.execute("SELECT pg_current_xact_id()")  # an open transaction: the relay waits
        held = []
        for i in range(HELD_TASKS):
            r = api.post(
                "/api/v1/tasks",
                json={
                    "name": f"held-{i}",
                    "command": f"echo $HETEROFLOW_TASK_ID >> {up.runs}",
                    "env": BIG_ENV,
                },
            )
            assert r.status_code == 201, r.text
            held.append(str(r.json()["id"]))
        print(f"filled {fill(filler) / 2**20:.0f} MiB")

        def create_shed() -> httpx.Response | None:
            r = up.create(api, "while-full")
            return r if r.status_code == 503 and "below the threshold" in r.text else None

        shed = wait_until(create_shed, FULL_SEEN_WITHIN_S, 0.2, "a create shed for the disk")
        assert shed.headers["retry-after"] == "5", shed.headers
        assert shed.json()["code"] == 50302, shed.text

        def unready() -> bool:
            status, checks = up.readyz()
            failing = {k for k, v in checks.items() if v != "ok"}
            return status == 503 and {"disk_space", "jetstream_writes"} <= failing

        took = up.until(unready, "/readyz naming the disk and the writes", FULL_SEEN_WITHIN_S)
        print(f"/readyz while full named the causes within {took:.1f} s: {up.readyz()[1]}")
        hold.rollback()  # the relay publishes the held events into the full disk

        def relay_refused() -> bool:
            return up.readyz()[1].get("relay", "ok") != "ok"

        up.until(relay_refused, "/readyz naming the relay", FULL_SEEN_WITHIN_S)
        print(f"/readyz names the relay: {up.readyz()[1]['relay']}")

        filler.unlink()
        freed = time.monotonic()
        ids: list[str] = []
        for i in range(5):  # at once: JetStream still refuses writes, the tasks wait

            def created(i: int = i) -> str | None:
                try:
                    r = up.create(api, f"after-full-{i}")
                except httpx.HTTPError:
                    return None
                return str(r.json()["id"]) if r.status_code == 201 else None

            ids.append(wait_until(created, 60, 0.2, "a create acknowledged after the space"))
        ids = held + ids
        wait_completed(up, api, ids)

        def healed() -> bool:
            status, checks = up.readyz()
            return status == 200 and set(checks.values()) == {"ok"} and relay_lag(up) == 0

        up.until(healed, "ready with every check ok and the relay caught up", HEALED_WITHIN_S)
        took = time.monotonic() - freed
        print(f"healed {took:.1f} s after the space was freed: {up.readyz()}")
    log = up.output(0)
    assert "embedded_server_unhealthy" in log, log[-4000:]
    assert sorted(up.runs.read_text().split()) == sorted(ids)  # each ran, once
    up.stop()
