"""`heteroflow events replay|export|tail` against a real store."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import psycopg
import pytest

from libs import auth
from libs.domain.reasons import ReasonCode
from libs.domain.task.decide import decide_transition
from libs.domain.task.model import TaskSpec, TenantId
from libs.domain.task.states import Actor, TaskStatus
from libs.store.eventstore import EventStore

pytestmark = pytest.mark.integration
BIN = Path(sys.executable).parent / "heteroflow"


async def seed(url: str) -> list[str]:
    store = await EventStore.open(url)
    await auth.create_tenant(store, "acme", "Acme")
    await auth.issue_api_key(store, "acme", "ci")
    tasks = await store.create_tasks(
        [(TenantId("acme"), TaskSpec(name=f"t{i}", image="busybox"), None, None) for i in range(20)]
    )
    for to in (TaskStatus.SCHEDULED, TaskStatus.RUNNING):
        await store.execute_batch(
            {
                t.id: partial(
                    decide_transition, to=to, actor=Actor.SCHEDULER, reason_code=ReasonCode.REPORTED
                )
                for t in tasks
            }
        )
    await store.close()
    return [t.id for t in tasks]


def ops(url: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"HETEROFLOW_DATABASE_URL": url}
    return subprocess.run(
        [str(BIN), "events", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_replay_reports_zero_differences_then_a_tampered_row(database_url: str) -> None:
    ids = asyncio.run(seed(database_url))
    done = ops(database_url, "replay")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["events"] == 2 + 20 * 3 and report["differences"] == {}
    with psycopg.connect(database_url) as conn:
        conn.execute("UPDATE tasks SET status = 'failed' WHERE id = %s", (ids[0],))
    dry = ops(database_url, "replay", "--dry-run")
    assert dry.returncode == 1 and json.loads(dry.stdout)["differences"] == {"tasks": [ids[0]]}
    fixed = ops(database_url, "replay")
    assert fixed.returncode == 1, "it reports what it repaired"
    assert ops(database_url, "replay").returncode == 0
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT status FROM tasks WHERE id = %s", (ids[0],)).fetchone()
    assert row == ("running",)


def test_export_and_tail(database_url: str, tmp_path: Path) -> None:
    ids = asyncio.run(seed(database_url))
    out = tmp_path / "events.jsonl"
    done = ops(database_url, "export", "--stream", ids[0], "-O", str(out))
    assert done.returncode == 0, done.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [e["type"] for e in lines] == [
        "task_created",
        "task_status_changed",
        "task_status_changed",
    ]
    assert [e["version"] for e in lines] == [1, 2, 3]
    env = os.environ | {"HETEROFLOW_DATABASE_URL": database_url}
    tail = subprocess.Popen(
        [str(BIN), "events", "tail", "--from", "60"], env=env, stdout=subprocess.PIPE, text=True
    )
    printed: list[str] = []
    stdout = tail.stdout
    assert stdout is not None
    reader = threading.Thread(target=lambda: printed.extend(iter(stdout.readline, "")))
    reader.start()
    deadline = time.monotonic() + 15
    while len(printed) < 3 and time.monotonic() < deadline:  # until it printed the three
        time.sleep(0.05)
    tail.terminate()
    tail.wait(timeout=10)
    reader.join(timeout=10)
    got = [json.loads(x) for x in printed]
    assert [e["position"] for e in got] == [60, 61, 62]


def test_dead_letters_lists_what_the_relay_skipped(database_url: str) -> None:
    asyncio.run(seed(database_url))
    with psycopg.connect(database_url) as conn:
        position, event_id = conn.execute(
            "SELECT position, event_id::text FROM events ORDER BY position LIMIT 1"
        ).fetchone() or (0, "")
        conn.execute(
            "INSERT INTO relay_dead_letters (relay, event_id, position, stream_id, stream_type,"
            " type, subject, size_bytes, error) VALUES ('outbox', %s, %s, 's', 'task', 't',"
            " 'hf.evt.task.s.t', 9000000, 'too large')",
            (event_id, position),
        )
    done = ops(database_url, "dead-letters")
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    letter = json.loads(line)
    assert letter["event_id"] == event_id and letter["position"] == position
    assert letter["error"] == "too large" and letter["size_bytes"] == 9000000
