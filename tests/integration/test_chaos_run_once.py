"""Chaos: `heteroflow up` killed (SIGKILL) while STARTs it has taken are not yet
acknowledged, restarted, and every attempt still runs once (each run appends its task's id to
a file: "once" is counted there).

A START is acknowledged once its reports are on the stream; one unacknowledged when `up` died
is redelivered 30 s after the restart. By then the attempt has been re-adopted, has ended, and
retention (keeping none here) has removed its task directory: only the agent's attempt record
(agent/attempts.py) knows it ran. To have STARTs unacknowledged for certain, a blocker task
holds every CPU while a burst is created, so that the burst is placed at once, and a run a few
into the burst freezes the embedded nats-server (SIGSTOP): every START the agent holds then
runs without its reports reaching the stream. `up` is killed, the server thawed once the runs
begun have ended (one would freeze it again), its consumer shows STARTs unacknowledged, and
`up` is started again; the test waits until the agent's command consumer has nothing left
unacknowledged (the redelivered STARTs answered) and no task process is left, then counts.

`HETEROFLOW_CHAOS_PACED=300@10` runs the issue's figure by hand instead: 300 creates at 10/s,
`up` killed after 12 s (no freeze, default retention), started again, the counts printed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import nats
import psutil
import pytest

from libs.bus import permissions as perms
from libs.bus.subjects import NODE_STREAM

from .test_chaos import Up, finish
from .test_chaos import up as up  # the fixture: one state directory, `up` run on it

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BURST = 24  # tasks placed at once: the agent holds many STARTs when the bus freezes
# The run that freezes the bus (the blocker's is the first): a few runs into the burst, once
# the scheduler's STARTs for all of it (sent in more than one publish) have reached the agent.
FREEZE_AT = 7
RUN_FROZEN = 3  # runs begun with the bus frozen: their STARTs cannot be acknowledged
NODE_CPUS = 4
SMALL = {"cpu_cores": 0.1, "memory_mb": 64, "max_retries": 0}
# The redelivery comes ack_wait (30 s) after the restart; the tasks end well before.
SETTLED_WITHIN_S = 120.0
PACED = os.environ.get("HETEROFLOW_CHAOS_PACED", "")


def consumer_state(up: Up) -> tuple[int, int]:
    """(unacknowledged, undelivered) commands of the local agent's durable consumer."""
    users = json.loads((up.home / "nats" / "users.json").read_text())
    url = f"nats://{perms.ADMIN}:{users[perms.ADMIN]}@127.0.0.1:{up.nats_port}"

    async def ask() -> tuple[int, int]:
        nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            info = await nc.jetstream().consumer_info(NODE_STREAM, "agent-chaos-node")
            return info.num_ack_pending or 0, info.num_pending or 0
        finally:
            await nc.close()

    return asyncio.run(ask())


def task_processes(up: Up) -> list[int]:
    """Live processes of the tasks (their command line names the runs file)."""
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(str(up.runs) in part for part in (proc.info["cmdline"] or [])):
            out.append(proc.pid)
    return out


def wait_settled(up: Up) -> float:
    """Until every command was delivered and acknowledged and no task process is left."""

    def settled() -> bool:
        try:
            pending = consumer_state(up)
        except Exception:  # the server restarting, say: not settled yet
            return False
        return pending == (0, 0) and not task_processes(up)

    return up.until(settled, "every command acknowledged, no task left running", SETTLED_WITHIN_S)


def run_counts(up: Up) -> collections.Counter[str]:
    return collections.Counter(up.runs.read_text().split() if up.runs.exists() else [])


def create_burst(up: Up, command: str, n: int) -> list[str]:
    def one(i: int) -> str | None:
        with up.client() as api:
            try:
                r = api.post(
                    "/api/v1/tasks", json=SMALL | {"name": f"once-{i}", "command": command}
                )
            except httpx.HTTPError:
                return None
            return str(r.json()["id"]) if r.status_code == 201 else None

    with ThreadPoolExecutor(8) as pool:
        return [t for t in pool.map(one, range(n)) if t]


@pytest.mark.skipif(bool(PACED), reason="HETEROFLOW_CHAOS_PACED runs the paced variant")
def test_up_killed_with_starts_unacknowledged_runs_each_attempt_once(up: Up) -> None:
    up.extra_env = {
        "HETEROFLOW_FINISHED_KEEP": "0",  # nothing of an ended attempt is kept
        "HETEROFLOW_NODE_CPU_CORES": str(NODE_CPUS),
        # The frozen bus outlasts the kill of `up` on a slow runner: its supervisor would end
        # it after 5 s and start another, which could take the agent's reports and acks.
        "HETEROFLOW_EMBEDDED_UNHEALTHY_AFTER_S": "120",
    }
    up.start()
    bus = up.recorded("nats")
    go = up.root / "go"
    with up.client() as api:
        # Holds every CPU until told: the burst waits in `pending`, then is placed at once,
        # so the agent holds many STARTs when the bus freezes.
        blocker = api.post(
            "/api/v1/tasks",
            json=SMALL
            | {
                "name": "once-blocker",
                "cpu_cores": NODE_CPUS,
                "command": f"echo $HETEROFLOW_TASK_ID >> {up.runs}; "
                f"while [ ! -e {go} ]; do sleep 0.1; done",
            },
        )
        assert blocker.status_code == 201, blocker.text
        up.until(lambda: run_counts(up).total() == 1, "the blocker running", 60)
    freeze = f"grep -q nats-server /proc/{bus}/cmdline && kill -STOP {bus}"
    after = up.root / "after-freeze.log"  # runs that began with the bus already frozen
    command = (
        f"grep -q '^State:[[:space:]]*T' /proc/{bus}/status "
        f"&& echo $HETEROFLOW_TASK_ID >> {after}; "
        f"echo $HETEROFLOW_TASK_ID >> {up.runs}; "
        f"if [ $(wc -l < {up.runs}) -ge {FREEZE_AT} ]; then {freeze}; fi; true"
    )
    acknowledged = [blocker.json()["id"], *create_burst(up, command, BURST)]
    assert len(acknowledged) == BURST + 1, "a create of the burst was refused"
    go.touch()

    def ran_since_frozen() -> bool:
        lines = after.read_text().split() if after.exists() else []
        return len(lines) >= RUN_FROZEN

    try:
        # `up` is killed while the bus is still frozen: the STARTs run since stay unacknowledged.
        up.until(ran_since_frozen, f"{RUN_FROZEN} STARTs run with the bus frozen", 60)
        assert up.proc is not None
        up.proc.kill()  # SIGKILL, its STARTs since the freeze unacknowledged
        up.proc.wait()
        up.proc = None
        # A run already started would freeze the bus again once thawed.
        up.until(lambda: not task_processes(up), "the runs begun ended", 60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(bus, signal.SIGCONT)
    unacknowledged, _ = consumer_state(up)
    print(
        f"{len(acknowledged)} acknowledged, {run_counts(up).total()} run when `up` was "
        f"killed, {unacknowledged} START(s) unacknowledged"
    )
    assert unacknowledged >= RUN_FROZEN

    up.start()
    took = wait_settled(up)
    print(f"commands settled {took:.1f} s after the restart")
    twice = {t: n for t, n in run_counts(up).items() if n > 1}
    assert not twice, f"ran more than once: {twice}"
    answered = up.output(0).count("start_answered_from_record")
    print(f"{answered} redelivered START(s) answered from the record")
    assert answered >= 1, "no START was redelivered: the test did not test"
    finish(up, acknowledged)


@pytest.mark.skipif(not PACED, reason="set HETEROFLOW_CHAOS_PACED=<creates>@<per second>")
def test_paced_creates_up_killed_each_attempt_runs_once(up: Up) -> None:
    total, _, rate = PACED.partition("@")
    creates, per_s = int(total), float(rate or 10)
    up.start()
    acknowledged: list[str] = []

    def create_paced() -> None:
        """All the creates at the pace, through the kill and the restart (unanswered then)."""
        started = time.monotonic()
        with up.client() as api:
            for i in range(creates):
                time.sleep(max(0.0, started + i / per_s - time.monotonic()))
                body = SMALL | {
                    "name": f"paced-{i}",
                    "command": f"echo $HETEROFLOW_TASK_ID >> {up.runs}",
                }
                try:
                    r = api.post("/api/v1/tasks", json=body)
                except httpx.HTTPError:
                    continue
                if r.status_code == 201:
                    acknowledged.append(r.json()["id"])

    creator = threading.Thread(target=create_paced)
    creator.start()
    killed_at = time.monotonic() + 12.0
    up.until(lambda: time.monotonic() >= killed_at, "12 s of creates", 60)
    assert up.proc is not None
    up.proc.kill()
    up.proc.wait()
    up.start()
    creator.join(creates / per_s + 120)
    took = wait_settled(up)
    counts = run_counts(up)
    twice = {t: n for t, n in counts.items() if n > 1}
    answered = up.output(0).count("start_answered_from_record")
    print(
        f"paced {PACED}: {len(acknowledged)} acknowledged, {len(counts)} ran, "
        f"{len(twice)} ran twice, {answered} START(s) answered from the record, "
        f"settled {took:.1f} s after the restart"
    )
    assert not twice, twice
    finish(up, acknowledged)
