"""Chaos: the JetStream store lost. `heteroflow up` (a subprocess, embedded servers) runs with
a `heteroflow agent` process of its own; `up` is stopped, `$HETEROFLOW_HOME/nats/jetstream`
deleted, and `up` started again on empty streams and an empty lease bucket, while the agent
stays connected (it reconnects to the new server by itself). Nobody helps it back:

* every leader is elected again within a lease TTL of `up` being ready: each lease's fence
  in PostgreSQL rises above what it was (a leader claims its term's token before it acts, and
  the claim is refused when the token is older than the fence);
* the agent that stayed connected consumes again: its durable consumer is declared again
  once the server says it does not exist, and it runs the tasks created after the restart;
* the store lost again under the running `up` (nats-server SIGKILLed, its store deleted,
  the supervisor starting it empty): `up` declares the streams and the bucket again, and the
  leaders and the agent are back by themselves;
* every task ends, each run once, the history checker is clean and replay finds no
  difference.

The weeks of history an installation has are stood in for by writing them: just before the
stop, every row of `fences` is raised by `HISTORY` (as if that many terms and renewals had
gone by), so the new bucket's revisions, which start at 1, are far behind the fences. Without
the floor the lease bucket's revisions are kept above, every leader is refused until the
revisions climb past them (hours here, days for a real installation).
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from typing import Any

import psycopg
import pytest

from libs.embedded import EmbeddedPostgres
from tests.integration.test_chaos import RESTART_BACKOFF_S, Up, finish, up, wait_completed
from tests.wait import WaitTimeout

pytestmark = [pytest.mark.integration, pytest.mark.slow]

__all__ = ["up"]  # the fixture, shared with the other chaos tests

# The leading services' lease TTL (services/*/service.py LEASE_TTL_S).
LEASE_TTL_S = 6.0
HISTORY = 100_000
SMALL = {"max_retries": 0, "cpu_cores": 0.1, "memory_mb": 64}


def sql(u: Up, query: str, *args: Any) -> list[tuple[Any, ...]]:
    """`query` on the running `up`'s embedded PostgreSQL (attached to, never started)."""
    pg = EmbeddedPostgres(u.home / "postgres", attach=True)
    assert pg._running_elsewhere(), "the database of `up` is not running"
    with psycopg.connect(pg.url, autocommit=True) as conn:
        cur = conn.execute(query, args or None)
        return cur.fetchall() if cur.description else []


def fences(u: Up) -> dict[str, int]:
    return {str(lease): int(token) for lease, token in sql(u, "SELECT lease, token FROM fences")}


def create(u: Up, api: Any, name: str) -> str:
    body = {"name": name, "command": f"echo $HETEROFLOW_TASK_ID >> {u.runs}"} | SMALL
    r = api.post("/api/v1/tasks", json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_a_lost_jetstream_store_heals_by_itself(up: Up) -> None:
    """Measured here (2 shared cores, 4 runs): `up` ready 6.5-15 s after its start on the
    empty store, every leader's claim in 0.0-0.3 s after that, and the agent that stayed
    connected had run new tasks 12 s after the start."""
    # Only the agent of its own runs tasks: what runs after the restart went through it.
    up.extra_env = {"HETEROFLOW_LOCAL_AGENT": "false"}
    up.start()
    agent = up.start_agent("bus-node")
    with up.client() as api:
        before = [create(up, api, f"bus-before-{i}") for i in range(3)]
        wait_completed(up, api, before)
    raised = {
        str(lease): int(token)
        for lease, token in sql(
            up, "UPDATE fences SET token = token + %s RETURNING lease, token", HISTORY
        )
    }
    assert len(raised) >= 3, f"the leaders of a running `up`: {raised}"
    up.stop()
    store = up.home / "nats" / "jetstream"
    assert store.is_dir(), f"no JetStream store at {store}"
    shutil.rmtree(store)

    started = time.monotonic()
    up.start()
    try:
        took = up.until(
            lambda: all(fences(up).get(lease, 0) > token for lease, token in raised.items()),
            f"every leader elected and its claim accepted (fences before: {raised})",
            LEASE_TTL_S,
        )
    except WaitTimeout as exc:
        raise AssertionError(f"{exc}; fences now: {fences(up)}\n{up.output()}") from exc
    print(f"every leader ({len(raised)}) elected {took:.1f} s after `up` was ready")
    with up.client() as api:
        after = [create(up, api, f"bus-after-{i}") for i in range(3)]
        wait_completed(up, api, after)
    print(f"the agent that stayed connected ran tasks {time.monotonic() - started:.1f} s after")
    assert agent.poll() is None, "the agent stayed up across the restart"
    log = (up.root / "agent-bus-node.log").read_text(errors="replace")
    assert "consumer_redeclared" in log, log[-3000:]
    assert "lease_bucket_raised" in up.output(0)

    # Lost again, under the running `up`: nats-server SIGKILLed and its store deleted, so
    # the supervisor starts it on an empty store; `up` declares the streams and the bucket
    # again (above the fences), the leaders and the agent come back by themselves.
    now = fences(up)
    os.kill(up.recorded("nats"), signal.SIGKILL)
    killed = time.monotonic()
    shutil.rmtree(store)  # within the supervisor's backoff before the restart
    up.until(
        lambda: all(fences(up).get(lease, 0) > token for lease, token in now.items()),
        f"every leader elected again under the running `up` (fences before: {now})",
        RESTART_BACKOFF_S + 30,
    )
    print(f"store lost under `up`: every leader back {time.monotonic() - killed:.1f} s after")
    with up.client() as api:
        later = [create(up, api, f"bus-later-{i}") for i in range(3)]
        wait_completed(up, api, later)
    print(f"store lost under `up`: the agent ran tasks {time.monotonic() - killed:.1f} s after")
    assert "bus_declared_again" in up.output(0)
    finish(up, before + after + later)
