"""`heteroflow check history` over a real platform's log: clean after busy work (placements,
shared cards, failures retried elsewhere, a stop, a timeline), then a forged event and a
forged timeline entry are reported with the events that show them, and replay names the entry.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from . import web
from .cluster import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]
BIN = Path(sys.executable).parent / "heteroflow"


def hf(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"HETEROFLOW_DATABASE_URL": url}
    return subprocess.run([str(BIN), *args], env=env, capture_output=True, text=True, timeout=120)


def check(url: str, *extra: str) -> tuple[int, dict[str, Any]]:
    done = hf(url, "check", "history", "--json", *extra)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def busy_history(cluster: Cluster) -> list[str]:
    """Tasks that complete, share cards, fail and are retried elsewhere, and are stopped."""
    cluster.start_agent("a", "process", HETEROFLOW_DECLARED_GPUS="nvidia:L4:23034x2")
    cluster.start_agent("b", "process", HETEROFLOW_DECLARED_GPUS="nvidia:L4:23034")
    ids = [cluster.create(command="echo ok", gpu_required=1)["id"] for _ in range(3)]
    ids += [cluster.create(command="echo half", gpu_compute_ratio=0.5)["id"] for _ in range(3)]
    retried = cluster.create(command="exit 3", max_retries=1, retry_delay=0)["id"]
    stopped = cluster.create(command="sleep 120")["id"]
    cluster.wait_status(stopped, "running", timeout=60)
    resp = web.post(f"{cluster.url}/api/v1/tasks/{stopped}/stop", headers=cluster.tenant)
    assert resp.status_code in (200, 202), resp.text
    for task_id in ids:
        cluster.wait_status(task_id, "completed", timeout=90)
    cluster.wait_status(stopped, "stopped", timeout=60)
    cluster.wait(lambda: _gave_up(cluster, retried), f"{retried} given up", 90)
    cluster.wait(lambda: _timeline_rows(cluster) > 0, "timeline entries written", 30)
    return [*ids, retried, stopped]


def _gave_up(cluster: Cluster, task_id: str) -> bool:
    with psycopg.connect(cluster.database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM events WHERE stream_id = %s AND type = 'task_retry_decided'"
            " AND payload->>'action' = 'give_up'",
            (task_id,),
        ).fetchone()
    return bool(row and row[0])


def _timeline_rows(cluster: Cluster) -> int:
    with psycopg.connect(cluster.database_url) as conn:
        row = conn.execute("SELECT count(*) FROM timeline").fetchone()
    return int(row[0]) if row else 0


def forge(url: str, task_id: str) -> tuple[str, str]:
    """Append a `completed -> running` to a completed task and a timeline entry of no event,
    as someone writing to the database behind the platform's back would."""
    event_id, entry_id = str(uuid.uuid4()), f"{uuid.uuid4()}:task:{task_id}"
    now = datetime.now(UTC)
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT max(version) FROM events WHERE stream_id = %s", (task_id,))
        version = int(row.fetchone()[0]) + 1  # type: ignore[index]
        payload = {
            "task_id": task_id,
            "from_status": "completed",
            "to_status": "running",
            "actor": "agent",
            "reason_code": "reported",
            "schema_version": 2,
        }
        conn.execute(
            "INSERT INTO events (event_id, stream_id, stream_type, version, type,"
            " schema_version, payload, occurred_at) VALUES (%s, %s, 'task', %s,"
            " 'task_status_changed', 2, %s, %s)",
            (event_id, task_id, version, Jsonb(payload), now),
        )
        conn.execute(
            "INSERT INTO timeline (id, subject_type, subject_id, kind, message, details,"
            " occurred_at, source_event) VALUES (%s, 'task', %s, 'container_lost',"
            " 'forged', '{}', %s, %s)",
            (entry_id, task_id, now, str(uuid.uuid4())),
        )
    return event_id, entry_id


def test_a_busy_history_is_clean_and_forgeries_are_named(cluster: Cluster, tmp_path: Path) -> None:
    ids = busy_history(cluster)
    url = cluster.database_url
    code, report = check(url)
    assert code == 0 and report["clean"], report["listed"]
    assert report["events"] > 8 * len(ids) // 2 and report["violations"] == 0

    acked = tmp_path / "acked.txt"
    acked.write_text("\n".join([*ids, "task-never-created"]) + "\n")
    code, report = check(url, "--acknowledged", str(acked))
    assert code == 1 and report["by_invariant"] == {"missing_create": 1}

    done_task = ids[0]
    event_id, entry_id = forge(url, done_task)
    code, report = check(url)
    assert code == 1
    assert report["by_invariant"] == {"terminal_reopened": 1, "timeline_without_event": 1}
    reopened = next(v for v in report["listed"] if v["invariant"] == "terminal_reopened")
    shown = [e["event_id"] for e in reopened["events"]]
    assert event_id in shown and len(shown) == 2  # the completion, then the forgery
    assert any(entry_id in v["message"] for v in report["listed"])

    text = hf(url, "check", "history")
    assert text.returncode == 1
    assert f"(event {event_id})" in text.stdout and "2 violation(s)" in text.stdout

    replay = hf(url, "events", "replay", "--dry-run")
    assert replay.returncode == 1, replay.stderr
    assert json.loads(replay.stdout)["differences"]["timeline"] == [entry_id]
