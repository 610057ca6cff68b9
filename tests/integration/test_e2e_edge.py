"""No poison pills, end to end on `heteroflow up` (real processes, real NATS and PostgreSQL):
a 10 MB create is refused with 413, an oversized event already in the store is dead-lettered,
and another tenant's task still runs to completion."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from . import web
from .cluster import Cluster

pytestmark = pytest.mark.integration
BIN = Path(sys.executable).parent / "heteroflow"


def other_tenant(cluster: Cluster) -> dict[str, str]:
    r = web.post(f"{cluster.url}/api/v1/tenants", json={"id": "globex"}, headers=cluster.operator)
    assert r.status_code == 201, r.text
    r = web.post(
        f"{cluster.url}/api/v1/tenants/globex/api-keys",
        json={"name": "ci"},
        headers=cluster.operator,
    )
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['key']}"}


def test_a_10_mb_create_and_an_oversized_event_stop_no_one(cluster: Cluster) -> None:
    cluster.start_agent("edge-1", "process")
    globex = other_tenant(cluster)

    big = json.dumps({"name": "big", "image": "busybox", "command": "x" * 10_000_000})
    r = web.post(
        f"{cluster.url}/api/v1/tasks",
        content=big,
        headers=cluster.tenant | {"content-type": "application/json"},
    )
    assert r.status_code == 413 and r.json()["code"] == 41301, r.text

    # What an unlimited gateway once wrote: an event over the server's 8 MB max_payload.
    poison = str(uuid.uuid4())
    with psycopg.connect(cluster.database_url) as conn:
        conn.execute(
            "INSERT INTO events (event_id, stream_id, stream_type, version, type, payload,"
            " occurred_at) VALUES (%s, 'poison-1', 'poison', 1, 'thing_happened', %s, now())",
            (poison, Jsonb({"x": "y" * (9 * 1024 * 1024)})),
        )

    r = web.post(
        f"{cluster.url}/api/v1/tasks",
        json={"name": "after", "image": "busybox", "command": "echo fine"},
        headers=globex,
    )
    assert r.status_code == 201, r.text
    task_id = r.json()["id"]
    cluster.wait(
        lambda: (
            web.get(f"{cluster.url}/api/v1/tasks/{task_id}", headers=globex).json()["status"]
            == "completed"
        ),
        f"{task_id} completed behind the poisoned event",
        timeout=60,
    )

    env = os.environ | {"HETEROFLOW_DATABASE_URL": cluster.database_url}
    done = subprocess.run(
        [str(BIN), "events", "dead-letters"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["event_id"] for line in done.stdout.splitlines()] == [poison]
    metrics = web.get(f"{cluster.url}/metrics").text
    assert 'heteroflow_relay_dead_letters_total{relay="outbox"} 1.0' in metrics
